"""Source checks of kernel code for hazards that neither the interpreter nor the compiler reports.

:func:`unused_acquires` finds atomics with acquire semantics (``sem="acquire"`` or
``"acq_rel"``) whose result is never used.  An acquire is only a promise about the reads that
*follow* it; the compiler is free to treat an atomic whose value nobody reads as a pure
side effect, and one that writes nothing (``atomic_add(ptr, 0, sem="acquire")``, the usual
poll) as dead code: Triton 3.6 deletes it, silently turning every wait built on it into
relaxed polls (a data race on the GPU, invisible to the interpreter, whose programs run one
after another).  Using the value — in the loop condition of the wait, say — keeps it.

``python -m fusecore.kernel_lint <files or folders>`` prints every finding and exits 1 if any.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ATOMICS = {"atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_xchg",
           "atomic_xor"}
ACQUIRING = {"acquire", "acq_rel"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    function: str
    call: str

    def __str__(self) -> str:
        return (f"{self.path}:{self.line}: in {self.function}(): the result of {self.call}(..., sem=acquire) "
                "is never used, so the compiler may delete the atomic and its ordering; use its value")


def _is_acquiring_atomic(node: ast.AST) -> str | None:
    """The atomic's name if ``node`` is a call ``tl.atomic_*(..., sem="acquire" | "acq_rel")``."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ATOMICS:
        return None
    for kw in node.keywords:
        if kw.arg == "sem" and isinstance(kw.value, ast.Constant) and kw.value.value in ACQUIRING:
            return name
    return None


def unused_acquires(source: str, path: str = "<source>") -> list[Finding]:
    """Every acquiring atomic in ``source`` whose result is discarded or bound to a name never read.

    Checked per function: a bare expression statement, or an assignment to a plain name that
    no expression of the same function reads.
    """
    findings = []
    for fn in ast.walk(ast.parse(source, filename=path)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for stmt in ast.walk(fn):
            value, targets = None, []
            if isinstance(stmt, ast.Expr):
                value = stmt.value
            elif isinstance(stmt, ast.Assign):
                value, targets = stmt.value, stmt.targets
            elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
                continue  # an annotated or augmented name is read by construction or rare in kernels
            call = _is_acquiring_atomic(value) if value is not None else None
            if call is None:
                continue
            if not targets or all(isinstance(t, ast.Name) and t.id not in read for t in targets):
                findings.append(Finding(path, stmt.lineno, fn.name, call))
    return findings


def check_paths(paths: list[str | Path]) -> list[Finding]:
    """:func:`unused_acquires` over every ``.py`` file of the given files and folders."""
    files = []
    for p in map(Path, paths):
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return [f for file in files for f in unused_acquires(file.read_text(), str(file))]


def main(argv: list[str]) -> int:
    findings = check_paths(argv or ["."])
    for f in findings:
        print(f)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
