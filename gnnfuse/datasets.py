"""Graphs for tests, examples and benchmarks: Planetoid citation data and power-law graphs.

:func:`load_planetoid` reads the raw Planetoid files (``ind.<name>.{x,tx,allx,y,ty,ally,graph,
test.index}``, Python-2 pickles) and builds the standard split exactly as PyG's
``Planetoid(split="public")`` does: the first ``len(y)`` nodes train, the next 500 validate,
the 1000 listed test nodes test; self loops removed and duplicate edges merged.  PubMed's
feature matrix is not shipped here, so for it features of width 500 are synthesised
(seeded, non-negative, row-normalized like TF-IDF rows) — say so wherever accuracy matters.

:func:`power_law_graph` draws a reproducible graph whose in-degrees follow a Zipf law tuned
so the heaviest node receives about ``max_in_degree`` edges (the arxiv-like and
Reddit-scale graphs of TARGETS.md).
"""

from __future__ import annotations

import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")
DATASETS_ENV = "FUSEKIT_DATASETS"
PUBMED_FEATURES = 500


@dataclass
class Planetoid:
    """One Planetoid dataset: ``x [N, F]`` float32, ``y [N]`` int64, ``edge_index [2, E]``
    (both directions, no self loops, no duplicates), boolean split masks, ``num_classes``,
    and ``synthetic_features`` (True for PubMed here)."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    synthetic_features: bool

    @property
    def num_nodes(self) -> int:
        return int(self.y.numel())


def default_planetoid_root() -> Path:
    """Where the raw Planetoid files are looked for: ``$FUSEKIT_DATASETS/planetoid`` when that
    variable is set, else ``<repository>/../shared/datasets/planetoid``."""
    datasets = os.environ.get(DATASETS_ENV)
    base = Path(datasets) if datasets else Path(__file__).resolve().parents[2] / "shared" / "datasets"
    return base / "planetoid"


def planetoid_available(name: str, root: str | Path | None = None) -> bool:
    """Whether the raw files of ``name`` are present under ``root`` (default: the default root)."""
    return (Path(root or default_planetoid_root()) / f"ind.{name.lower()}.graph").exists()


def _read(folder: Path, name: str, part: str):
    path = folder / f"ind.{name}.{part}"
    if part == "test.index":
        return [int(line) for line in path.read_text().split()]
    with path.open("rb") as f, warnings.catch_warnings():
        # The pickles name scipy's old module path (scipy.sparse.csr), deprecated but readable.
        warnings.simplefilter("ignore", DeprecationWarning)
        return pickle.load(f, encoding="latin1")


def _dense(matrix) -> np.ndarray:
    return np.asarray(matrix.todense() if hasattr(matrix, "todense") else matrix, dtype=np.float32)


def load_planetoid(name: str, root: str | Path | None = None) -> Planetoid:
    """Load ``name`` (cora, citeseer, pubmed) from the folder ``root`` holding the raw files
    (default: :func:`default_planetoid_root`)."""
    name = name.lower()
    if name not in PLANETOID_NAMES:
        raise ValueError(f"name must be one of {PLANETOID_NAMES}, got {name!r}")
    folder = Path(root or default_planetoid_root())
    if not (folder / f"ind.{name}.graph").exists():
        raise FileNotFoundError(f"no Planetoid files for {name!r} in {folder}")
    y, ty, ally = (np.asarray(_read(folder, name, p)) for p in ("y", "ty", "ally"))
    graph = _read(folder, name, "graph")
    test_index = np.asarray(_read(folder, name, "test.index"), dtype=np.int64)
    sorted_test = np.sort(test_index)
    synthetic = not (folder / f"ind.{name}.allx").exists()
    if synthetic:
        tx = allx = None
    else:
        tx, allx = _dense(_read(folder, name, "tx")), _dense(_read(folder, name, "allx"))
    if name == "citeseer":
        # Isolated test nodes are missing from tx / ty: pad them with zero rows (as PyG does).
        span = int(test_index.max() - test_index.min()) + 1
        ty_ext = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        ty_ext[sorted_test - test_index.min()] = ty
        ty = ty_ext
        if tx is not None:
            tx_ext = np.zeros((span, tx.shape[1]), dtype=np.float32)
            tx_ext[sorted_test - test_index.min()] = tx
            tx = tx_ext
    labels = np.concatenate([ally, ty]).argmax(1)
    labels[test_index] = labels[sorted_test]
    num_nodes = labels.shape[0]
    if synthetic:
        x = _synthetic_features(num_nodes, PUBMED_FEATURES, seed=0)
    else:
        x = np.concatenate([allx, tx])
        x[test_index] = x[sorted_test]
        x = torch.from_numpy(x)
    rows = np.concatenate([np.full(len(v), k, dtype=np.int64) for k, v in graph.items()])
    cols = np.concatenate([np.asarray(v, dtype=np.int64) for v in graph.values()])
    keep = (rows != cols) & (rows < num_nodes) & (cols < num_nodes)
    edge_index = torch.unique(torch.from_numpy(rows[keep] * num_nodes + cols[keep]))
    edge_index = torch.stack([edge_index // num_nodes, edge_index % num_nodes])
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    masks[0][: y.shape[0]] = True
    masks[1][y.shape[0]: y.shape[0] + 500] = True
    masks[2][torch.from_numpy(test_index)] = True
    return Planetoid(
        name=name, x=x, y=torch.from_numpy(labels).long(), edge_index=edge_index,
        train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
        num_classes=int(ally.shape[1]), synthetic_features=synthetic,
    )


def _synthetic_features(num_nodes: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(num_nodes, width, generator=gen) * (torch.rand(num_nodes, width, generator=gen) < 0.1)
    return x / x.sum(1, keepdim=True).clamp_min(1e-12)


def _zipf_exponent(num_nodes: int, top_share: float) -> float:
    """Exponent a with 1 / Σ_k k^-a = top_share (bisection; the top node's share of edges)."""
    ranks = torch.arange(1, num_nodes + 1, dtype=torch.float64)
    low, high = 0.0, 4.0
    for _ in range(60):
        mid = 0.5 * (low + high)
        share = 1.0 / torch.sum(ranks ** -mid).item()
        low, high = (mid, high) if share < top_share else (low, mid)
    return 0.5 * (low + high)


def power_law_graph(
    num_nodes: int, num_edges: int, max_in_degree: int, *, self_loops: bool = True, seed: int = 0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A reproducible ``edge_index [2, E]`` with Zipf-distributed in-degrees.

    Destinations are drawn with probability ∝ rank^-a (ranks shuffled over node ids), ``a``
    chosen so the top node expects ``max_in_degree`` edges; sources are uniform.  With
    ``self_loops`` one loop per node is included in ``num_edges``.
    """
    if num_nodes < 1 or num_edges < 0 or max_in_degree < 1:
        raise ValueError(
            f"need num_nodes >= 1, num_edges >= 0, max_in_degree >= 1; got {num_nodes}, {num_edges}, {max_in_degree}"
        )
    loops = num_nodes if self_loops else 0
    drawn = max(num_edges - loops, 0)
    gen = torch.Generator().manual_seed(seed)
    exponent = _zipf_exponent(num_nodes, min(1.0, max_in_degree / max(drawn, 1)))
    weights = torch.arange(1, num_nodes + 1, dtype=torch.float64) ** -exponent
    node_of_rank = torch.randperm(num_nodes, generator=gen)
    dst = node_of_rank[torch.multinomial(weights, drawn, replacement=True, generator=gen)] if drawn else (
        torch.zeros(0, dtype=torch.int64))
    src = torch.randint(0, num_nodes, (drawn,), generator=gen)
    if self_loops:
        nodes = torch.arange(num_nodes)
        src, dst = torch.cat([src, nodes]), torch.cat([dst, nodes])
    return torch.stack([src, dst]).to(device)
