"""The source pass's in-place ``α'`` store comes after a CTA barrier, read from the sm_90 PTX on the CPU.

With edge features the dot score's source pass reads each edge's score term ``t_p`` from the edge terms and
stores ``α'`` over it (``attention_backward.replace_terms``).  A ``[rows, heads]`` value is held by several threads,
all of which load ``t_p`` and one of which stores ``α'``; a store that overtakes another warp's load makes that warp
sum a wrong score (session 45: ``∂k`` / ``∂v`` 3-20% off on some GPU calls).  The interpreter runs no warps, so the
race cannot show on the CPU; what can be checked is the compiled order: in every specialisation of the three source
kernels (unrolled light rows, tile-form light rows, row kernel) compiled for sm_90, a ``bar.sync`` lies between the
last load of the terms and each ``α'`` store.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fusecore.backend import COMPILED

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "gnnfuse" / "kernels" / "attention_backward.py"

SCRIPT = """
import sys
sys.path.insert(0, "tests/gnnfuse")
import torch
from gnnfuse import Graph, ops
from gnn_testing import SCHEDULES, corner_case_edges
from test_attention_family import OPS, make_leaves
gen = torch.Generator().manual_seed(0)
graph = Graph(corner_case_edges(gen), 29)
for unrolled in (True, False):
    ops.LIGHT_SOURCE_UNROLLED = unrolled
    for dtype in (torch.float32, torch.bfloat16):
        leaves = [t.requires_grad_(True) for t in make_leaves(OPS["transformer+edge"], graph, 3, 5, dtype, "cpu", gen)]
        out = ops.transformer_attention(graph, *leaves, schedule=SCHEDULES["mixed"])
        torch.autograd.grad(out, leaves, torch.ones_like(out))
"""


def _lines(pattern: str) -> set[int]:
    return {i for i, line in enumerate(SOURCE.read_text().splitlines(), 1) if re.search(pattern, line)}


def unordered_stores(ptx: str, loads: set[int], stores: set[int], file_name: str = SOURCE.name) -> list[int]:
    """PTX line numbers of the global stores at source lines ``stores`` with no ``bar.sync`` after the last global
    load at source lines ``loads`` before them (lines of ``file_name``, as the ``.loc`` directives give them)."""
    files = {m.group(1) for m in re.finditer(r'\.file\s+(\d+)\s+"([^"]*)"', ptx) if m.group(2).endswith(file_name)}
    current, last_load, last_bar, bad = None, -1, -1, []
    for number, line in enumerate(ptx.splitlines()):
        loc = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", line)
        if loc:
            current = int(loc.group(2)) if loc.group(1) in files else None
        elif "bar.sync" in line:
            last_bar = number
        elif "ld.global" in line and current in loads:
            last_load = number
        elif "st.global" in line and current in stores and last_bar < last_load:
            bad.append(number)
    return bad


def test_unordered_stores_are_found():
    ptx = '\t.file\t1 "/x/attention_backward.py"\n\t.loc\t1 10 1\n\tld.global.b32 {%r1}, [%rd1];\n' \
          '\t.loc\t1 20 1\n\tst.global.b32 [%rd1], {%r2};\n\tbar.sync 0;\n\tst.global.b32 [%rd1], {%r2};\n'
    assert unordered_stores(ptx, {10}, {20}) == [4]  # the second store follows a barrier
    assert unordered_stores(ptx.replace("\t.loc\t1 20", "\tbar.sync 0;\n\t.loc\t1 20"), {10}, {20}) == []


@pytest.mark.skipif(COMPILED, reason="compile-only runs under the interpreter, on machines without a GPU")
def test_alpha_replaces_the_score_term_after_a_barrier(tmp_path):
    env = {**os.environ, "FUSEKIT_COMPILE_FOR": "sm_90", "FUSEKIT_COMPILE_ONLY": "1", "PYTHONPATH": str(ROOT),
           "FUSEKIT_COMPILE_DUMP": str(tmp_path)}
    env.pop("FUSEKIT_BACKEND", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    loads = _lines(r"tl\.load\(terms_ptr \+ terms_offs,")
    stores = _lines(r"tl\.store\(terms_ptr \+ offs, alpha_kept")
    assert len(loads) == 3 and len(stores) == 1, (loads, stores)
    checked = set()
    for ptx in tmp_path.glob("*attention_backward_src*kernel.*.ptx"):
        if "EDGE=True" not in ptx.with_suffix(".txt").read_text():
            continue
        text = ptx.read_text()
        assert not unordered_stores(text, loads, stores), ptx.name
        if re.search(r"st\.global", text):
            checked.add(ptx.name.split(".")[3])
    assert checked == {"attention_backward_src_light_kernel", "attention_backward_src_kernel"}, checked
