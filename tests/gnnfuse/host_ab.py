"""Host issue time of the same layer calls from two versions of gnnfuse/fusecore in one process, interleaved.

    python3 tests/gnnfuse/host_ab.py BASE_DIR [GRAPH] [ROUNDS] [CALLS] [ROWS]

``BASE_DIR`` holds the other version's ``fusecore`` and ``gnnfuse`` (``git archive REV fusecore gnnfuse | tar -x
-C BASE_DIR``); they are copied to a temporary folder under the names ``fusecore_base`` / ``gnnfuse_base`` and
imported beside this tree's packages.  ``ROWS``: comma-separated ``gat|gatv2|tr-bf16|fp32`` (arxiv-like shapes:
128 input features, 8 heads of 16).  Each row's forward (no grad) and training step are called ``CALLS`` times
per version, the versions alternating for ``ROUNDS`` rounds: a host's speed drifts between processes by more than a
host-side change moves it (session 27: ±40% on one machine), so only an interleaved A/B in one process resolves
such a change.  Prints the median issue time per call (host work alone) with its 20th-80th percentiles and the wall
time per call (synchronised after each batch).
"""
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

_base = Path(sys.argv.pop(1)).resolve()
_copies = Path(tempfile.mkdtemp(prefix="host_ab_"))
for _name in ("fusecore", "gnnfuse"):
    shutil.copytree(_base / _name, _copies / f"{_name}_base")
for _path in _copies.rglob("*.py"):
    _text = _path.read_text()
    _path.write_text(re.sub(r"\b(fusecore|gnnfuse)\b", r"\1_base", _text))
sys.path.insert(0, str(_copies))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gnnfuse_base  # noqa: E402, I001 - the renamed copy, importable only now

import gnnfuse  # noqa: E402
from benchmarks.cases.gnn import _edges  # noqa: E402

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
graph_name = sys.argv[1] if len(sys.argv) > 1 else "arxiv-like"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 40
edges, n = _edges(graph_name, dev)
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

def build(pkg, kind, dtype):
    torch.manual_seed(0)
    g = pkg.Graph(edges, n)
    if kind == "gat":
        layer = pkg.nn.GATConv(128, 16, 8)
    elif kind == "gatv2":
        layer = pkg.nn.GATv2Conv(128, 16, 8)
    else:
        layer = pkg.nn.GraphTransformerConv(128, 16, heads=8)
    layer = layer.to(device=dev, dtype=dtype)
    x = torch.randn(n, 128, device=dev, dtype=dtype)
    out = layer(g, x)
    grad = torch.randn_like(out)
    params = list(layer.parameters())
    def fwd():
        with torch.no_grad():
            return layer(g, x)
    def step():
        for p in params:
            p.grad = None
        layer(g, x).backward(grad)
    return fwd, step

rows = sys.argv[4].split(",") if len(sys.argv) > 4 else ["gat-bf16", "gat-fp32", "tr-bf16", "gatv2-fp32"]
print(f"# graph {graph_name}, {rounds} rounds x {calls} calls per version, interleaved; host issue us/call "
      f"(median, p20-p80), then wall us/call median", flush=True)
for row in rows:
    kind, dt = row.split("-")
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[dt]
    fns = {v: build(p, kind, dtype) for v, p in (("base", gnnfuse_base), ("new", gnnfuse))}
    for phase in (0, 1):
        issue = {"base": [], "new": []}
        wall = {"base": [], "new": []}
        for v in fns:
            for _ in range(10):
                fns[v][phase]()
        sync()
        for r in range(rounds):
            order = ("base", "new") if r % 2 == 0 else ("new", "base")
            for v in order:
                fn = fns[v][phase]
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                issue[v].append((t1 - t0) / calls * 1e6)
                wall[v].append((t2 - t0) / calls * 1e6)
        def q(xs, p):
            xs = sorted(xs)
            return xs[min(len(xs) - 1, int(p * len(xs)))]
        line = []
        for v in ("base", "new"):
            line.append(f"{v} {statistics.median(issue[v]):7.1f} ({q(issue[v], .2):.1f}-{q(issue[v], .8):.1f}) "
                        f"wall {statistics.median(wall[v]):7.1f}")
        ratio = statistics.median(issue["new"]) / statistics.median(issue["base"])
        print(f"== {row} {'fwd' if phase == 0 else 'step'}: " + " | ".join(line) + f" | new/base {ratio:.3f}",
              flush=True)
