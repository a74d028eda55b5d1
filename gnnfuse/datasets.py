"""Graphs for tests, examples and benchmarks: Planetoid citation data and power-law graphs.

:func:`load_planetoid` reads the raw Planetoid files (``ind.<name>.{tx,allx,y,ty,ally,graph,
test.index}``, Python-2 pickles; ``ind.<name>.x`` repeats the first rows of ``allx`` and is not
read) and builds the standard split exactly as PyG's
``Planetoid(split="public")`` does: the first ``len(y)`` nodes train, the next 500 validate,
the 1000 listed test nodes test; self loops removed and duplicate edges merged.  PubMed's
feature matrix is not shipped here, so for it features of width 500 are synthesised
(seeded, non-negative, row-normalized like TF-IDF rows) — say so wherever accuracy matters.

:func:`power_law_graph` draws a reproducible graph whose in-degrees follow a Zipf law tuned
so the heaviest node receives about ``max_in_degree`` edges (the arxiv-like and
Reddit-scale graphs of TARGETS.md).

The loader reads untrusted files defensively: pickles are unpickled with an allow-list of the
classes Planetoid files hold (numpy arrays, scipy sparse matrices, lists, dicts), every array's
type, shape and ids are checked against the other files, and anything wrong — a missing,
truncated or corrupted file, an unexpected type inside — raises :class:`PlanetoidFormatError`
(a ``ValueError``) or ``FileNotFoundError`` naming the file.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
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


class PlanetoidFormatError(ValueError):
    """A Planetoid file that cannot be read or holds something unexpected; names the file."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"Planetoid file {path}: {problem}")
        self.path = path


# (module, name) pairs a Planetoid pickle may reference: Python-2 and Python-3 spellings of
# numpy's array reconstruction, builtins and defaultdict, the bytes decoder of protocol-2
# pickles written by Python 3; scipy sparse classes by prefix.
_ALLOWED_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("collections", "defaultdict"), ("collections", "OrderedDict"),
    *((module, builtin) for module in ("__builtin__", "builtins") for builtin in ("list", "dict", "int", "tuple")),
}


class _PlanetoidUnpickler(pickle.Unpickler):
    """Unpickles only the classes listed above: a Planetoid file cannot run code."""

    def find_class(self, module: str, name: str):
        sparse = module.startswith("scipy.sparse") and name.endswith(("_matrix", "_array"))
        if (module, name) not in _ALLOWED_GLOBALS and not sparse:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (not a numpy / scipy / list type)")
        return super().find_class(module, name)


# A dense matrix read from a file may be at most this many bytes per byte of the file: the
# real files are sparse (Cora's allx densifies to 38 bytes per file byte, CiteSeer's to 57);
# a corrupted shape must not make the loader allocate gigabytes.
MAX_DENSE_BYTES_PER_FILE_BYTE = 1024
_MEMO_OPCODES = {"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"}


def _check_pickle_stream(data: bytes) -> None:
    """Raise ValueError for a malformed pickle stream before it is unpickled: unknown opcodes,
    truncated arguments, or memo indices no real file uses (the unpickler would grow its memo
    table to the index, many gigabytes for a corrupted 4-byte index)."""
    for op, arg, _ in pickletools.genops(data):
        if op.name in _MEMO_OPCODES and arg > len(data):
            raise ValueError(f"{op.name} memo index {arg} exceeds the stream length {len(data)}")


def _read(folder: Path, name: str, part: str):
    """One raw file: the test index as a list of ints, every other part unpickled."""
    path = folder / f"ind.{name}.{part}"
    if not path.is_file():
        raise FileNotFoundError(f"Planetoid file {path} is missing (needed to load {name!r})")
    try:
        if part == "test.index":
            return [int(line) for line in path.read_text(encoding="ascii").split()]
        # Read whole first: a corrupted length field then cannot ask the file for gigabytes.
        data = path.read_bytes()
        _check_pickle_stream(data)
        with warnings.catch_warnings():
            # The pickles name scipy's old module path (scipy.sparse.csr), deprecated but readable.
            warnings.simplefilter("ignore", DeprecationWarning)
            value = _PlanetoidUnpickler(io.BytesIO(data), encoding="latin1").load()
    except (OSError, MemoryError, RecursionError) as exc:
        raise PlanetoidFormatError(path, f"cannot be read ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # a corrupted pickle can fail in any constructor it names
        raise PlanetoidFormatError(path, f"truncated or corrupted ({type(exc).__name__}: {exc})") from exc
    if isinstance(value, np.ndarray) and value.nbytes > len(data):
        raise PlanetoidFormatError(path, f"holds an array of {value.nbytes} bytes, more than the file's {len(data)}")
    return value


def _matrix(path: Path, value, rows: int) -> np.ndarray:
    """A 2-D float32 array of ``rows`` rows from a dense array or a CSR / CSC / COO scipy matrix,
    its structure and size checked before it is densified."""
    import scipy.sparse as sp  # the feature pickles hold scipy matrices; scipy is not needed otherwise

    sparse_types = (sp.csr_matrix, sp.csc_matrix, sp.coo_matrix, sp.csr_array, sp.csc_array, sp.coo_array)
    if not isinstance(value, (np.ndarray, *sparse_types)):
        raise PlanetoidFormatError(
            path, f"expected a numpy array or a CSR / CSC / COO scipy sparse matrix, got {type(value).__name__}"
        )
    try:
        shape = tuple(int(n) for n in value.shape)
        if len(shape) != 2 or shape[0] != rows:
            raise PlanetoidFormatError(path, f"expected a 2-D matrix with {rows} rows, got shape {shape}")
        if isinstance(value, np.ndarray):
            dense = np.asarray(value, dtype=np.float32)
        else:
            _check_sparse_structure(value)
            limit = MAX_DENSE_BYTES_PER_FILE_BYTE * path.stat().st_size
            if 4 * shape[0] * shape[1] > limit:
                raise PlanetoidFormatError(path, f"shape {shape} is too large for a {path.stat().st_size}-byte file")
            dense = np.asarray(value.todense(), dtype=np.float32)
    except PlanetoidFormatError:
        raise
    except Exception as exc:  # inconsistent sparse structure, non-numeric entries
        raise PlanetoidFormatError(path, f"holds an invalid matrix ({type(exc).__name__}: {exc})") from exc
    if not np.isfinite(dense).all():
        raise PlanetoidFormatError(path, "holds NaN or infinite entries")
    return dense


def _check_sparse_structure(matrix) -> None:
    """Raise ValueError unless every stored index lies inside the matrix: unpickling restores a
    sparse matrix's arrays without checking them, and scipy's C++ densification trusts them."""
    if hasattr(matrix, "check_format"):  # CSR / CSC: index bounds, monotone indptr, lengths
        matrix.check_format(full_check=True)
        return
    row, col, data = (np.asarray(a) for a in (matrix.row, matrix.col, matrix.data))
    if not (row.ndim == col.ndim == data.ndim == 1 and row.size == col.size == data.size):
        raise ValueError("COO row, col and data must be 1-D arrays of one length")
    if row.size and not (0 <= row.min() and row.max() < matrix.shape[0] and 0 <= col.min()
                         and col.max() < matrix.shape[1]):
        raise ValueError(f"COO indices outside the shape {matrix.shape}")


def _edges(path: Path, graph, num_nodes: int) -> torch.Tensor:
    """``edge_index`` from the adjacency dict ``{node: [neighbours]}``: both directions kept as
    listed, self loops removed, duplicates merged, ids >= num_nodes dropped (as PyG does)."""
    if not isinstance(graph, dict):
        raise PlanetoidFormatError(path, f"expected a dict of adjacency lists, got {type(graph).__name__}")
    rows, cols = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    try:
        for node, neighbours in graph.items():
            neighbours = np.asarray(neighbours, dtype=np.int64)
            if neighbours.ndim != 1 or isinstance(node, bool) or not isinstance(node, (int, np.integer)):
                raise ValueError(f"entry {node!r}: {neighbours.shape}")
            rows.append(np.full(neighbours.size, node, dtype=np.int64))
            cols.append(neighbours)
    except (TypeError, ValueError, OverflowError) as exc:
        problem = f"adjacency lists must map int node ids to flat lists of ints ({exc})"
        raise PlanetoidFormatError(path, problem) from exc
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    if rows.size and min(rows.min(), cols.min()) < 0:
        raise PlanetoidFormatError(path, f"holds the negative node id {min(rows.min(), cols.min())}")
    keep = (rows != cols) & (rows < num_nodes) & (cols < num_nodes)
    flat = torch.unique(torch.from_numpy(rows[keep] * num_nodes + cols[keep]))
    return torch.stack([flat // num_nodes, flat % num_nodes])


def _labels(path: Path, value, classes: int | None = None) -> np.ndarray:
    """One-hot labels ``[rows, classes]`` (a 2-D numeric array)."""
    if not isinstance(value, np.ndarray) or value.ndim != 2 or value.dtype.kind not in "biuf":
        shape = getattr(value, "shape", None)
        raise PlanetoidFormatError(
            path, f"expected a 2-D numeric one-hot label array, got {type(value).__name__} of shape {shape}"
        )
    if classes is not None and value.shape[1] != classes:
        raise PlanetoidFormatError(path, f"has {value.shape[1]} label columns, the other label files {classes}")
    return value


def load_planetoid(name: str, root: str | Path | None = None) -> Planetoid:
    """Load ``name`` (cora, citeseer, pubmed) from the folder ``root`` holding the raw files
    (default: :func:`default_planetoid_root`).

    Raises ``FileNotFoundError`` naming the missing file or folder, and
    :class:`PlanetoidFormatError` naming a file that is truncated, corrupted or inconsistent
    with the others.  Only PubMed may lack ``allx`` / ``tx`` (features then synthesised).
    """
    if not isinstance(name, str) or name.lower() not in PLANETOID_NAMES:
        raise ValueError(f"name must be one of {PLANETOID_NAMES}, got {name!r}")
    name = name.lower()
    folder = Path(root or default_planetoid_root())
    if not (folder / f"ind.{name}.graph").exists():
        raise FileNotFoundError(f"no Planetoid files for {name!r} in {folder} (expected ind.{name}.graph there)")

    def path(part: str) -> Path:
        return folder / f"ind.{name}.{part}"

    ally = _labels(path("ally"), _read(folder, name, "ally"))
    classes = ally.shape[1]
    y = _labels(path("y"), _read(folder, name, "y"), classes)
    ty = _labels(path("ty"), _read(folder, name, "ty"), classes)
    if y.shape[0] > ally.shape[0]:
        raise PlanetoidFormatError(path("y"), f"has {y.shape[0]} training rows, more than ally's {ally.shape[0]}")
    test_index = np.asarray(_read(folder, name, "test.index"), dtype=np.int64)
    _check_test_index(path("test.index"), test_index, len(ally), len(ty), padded=name == "citeseer")
    sorted_test = np.sort(test_index)
    synthetic = name == "pubmed" and not path("allx").exists()
    if synthetic:
        tx = allx = None
    else:
        allx = _matrix(path("allx"), _read(folder, name, "allx"), rows=len(ally))
        tx = _matrix(path("tx"), _read(folder, name, "tx"), rows=len(ty))
        if tx.shape[1] != allx.shape[1]:
            raise PlanetoidFormatError(path("tx"), f"has {tx.shape[1]} feature columns, allx {allx.shape[1]}")
    graph = _read(folder, name, "graph")
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
    edge_index = _edges(path("graph"), graph, num_nodes)
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    masks[0][: y.shape[0]] = True
    masks[1][y.shape[0]: y.shape[0] + 500] = True
    masks[2][torch.from_numpy(test_index)] = True
    return Planetoid(
        name=name, x=x, y=torch.from_numpy(labels).long(), edge_index=edge_index,
        train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
        num_classes=int(classes), synthetic_features=synthetic,
    )


def _check_test_index(path: Path, test_index: np.ndarray, num_labelled: int, num_test: int, padded: bool) -> None:
    """The test ids: distinct, one per row of ``ty``, and exactly the nodes after the ``ally``
    rows (CiteSeer: within ``[num_labelled, max]``, its isolated test nodes are absent)."""
    if test_index.size != num_test or np.unique(test_index).size != test_index.size:
        raise PlanetoidFormatError(
            path, f"expected {num_test} distinct test node ids (one per row of ty), got {test_index.size} "
            f"ids of which {np.unique(test_index).size} distinct"
        )
    if not test_index.size:
        return
    low, high = int(test_index.min()), int(test_index.max())
    top = high if padded else num_labelled + num_test - 1
    if low != num_labelled or high > top:
        raise PlanetoidFormatError(
            path, f"test node ids must start at {num_labelled} (after the ally rows) and end by {top}; "
            f"got ids in [{low}, {high}]"
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
