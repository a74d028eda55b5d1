"""Benchmark cases, one module per domain; importing this package registers them all.

A domain's module is skipped (with the reason printed) when the domain's package or one of
its optional peers cannot be imported.
"""

import importlib

CASE_MODULES = ("core", "gnn", "sim", "llm")
SKIPPED: dict[str, str] = {}


def load_all(domains: list[str] | None = None) -> None:
    """Import the case modules of ``domains`` (default: all); a failing import skips that domain."""
    for name in CASE_MODULES:
        if domains and name not in domains:
            continue
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(f"{__name__}.{name}"):
                continue  # the domain has no cases yet
            SKIPPED[name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a broken domain must not take the others down
            SKIPPED[name] = f"{type(exc).__name__}: {exc}"
