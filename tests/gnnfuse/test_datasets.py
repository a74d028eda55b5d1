"""Planetoid loader against PyG's reader (real files and tiny written ones), its handling of
missing, truncated and corrupted files (fuzzed), and the power-law generator."""

import pickle
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from gnn_testing import PLANETOID, planetoid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnfuse.datasets import PlanetoidFormatError, load_planetoid, power_law_graph

PARTS = ("tx", "allx", "y", "ty", "ally", "graph", "test.index")  # what the loader reads (not ind.x)


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_planetoid_matches_pyg_public_split(name):
    data = planetoid(name)
    from torch_geometric.io.planetoid import read_planetoid_data

    pyg = read_planetoid_data(str(PLANETOID), name)
    assert_same_as_pyg(data, pyg)
    assert not data.synthetic_features


def assert_same_as_pyg(data, pyg):
    assert torch.equal(data.x, pyg.x) and torch.equal(data.y, pyg.y)
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(data, mask), getattr(pyg, mask))
    ours = torch.sort(data.edge_index[0] * data.num_nodes + data.edge_index[1]).values
    # PyG keeps self loops that the loader removes (GAT layers add exactly one per node).
    pyg_edges = pyg.edge_index[:, pyg.edge_index[0] != pyg.edge_index[1]]
    theirs = torch.unique(pyg_edges[0] * data.num_nodes + pyg_edges[1])
    assert torch.equal(ours, theirs)


def test_pubmed_structure_is_real_and_features_synthetic():
    data = planetoid("pubmed")
    assert data.num_nodes == 19717 and data.x.shape == (19717, 500) and data.synthetic_features
    assert data.num_classes == 3 and int(data.train_mask.sum()) == 60 and int(data.test_mask.sum()) == 1000


def test_power_law_graph_is_reproducible_and_heavy_tailed():
    a = power_law_graph(2000, 30000, 3000, seed=3)
    b = power_law_graph(2000, 30000, 3000, seed=3)
    assert torch.equal(a, b) and a.shape == (2, 30000)
    degree = torch.bincount(a[1], minlength=2000)
    assert 0.7 * 3000 < int(degree.max()) < 1.3 * 3000
    assert int((a[0] == a[1]).sum()) >= 2000  # one self loop per node at least
    assert not torch.equal(a, power_law_graph(2000, 30000, 3000, seed=4))


# ---------------------------------------------------------------- tiny Planetoid files

TRAIN, LABELLED, TEST, FEATURES, CLASSES = 7, 510, 23, 6, 3  # PyG's split needs train + 500 labelled


def tiny_planetoid_files(seed: int, name: str = "cora") -> dict[str, bytes]:
    """The raw files of a small Planetoid-format dataset, as the real ones are laid out:
    sparse CSR features, one-hot labels, an adjacency dict with self loops, duplicates and
    isolated nodes, and a shuffled test index (CiteSeer-style: with gaps, rows missing)."""
    rng = np.random.default_rng(seed)
    gaps = 4 if name == "citeseer" else 0
    num_nodes = LABELLED + TEST + gaps
    test_ids = LABELLED + np.sort(rng.choice(TEST + gaps, TEST, replace=False))
    test_ids[0], test_ids[-1] = LABELLED, num_nodes - 1  # the span covers every test slot
    test_ids = rng.permutation(test_ids)

    def features(rows):
        return sp.csr_matrix((rng.random((rows, FEATURES)) < 0.3).astype(np.float32))

    def labels(rows):
        return np.eye(CLASSES, dtype=np.int64)[rng.integers(0, CLASSES, rows)]

    allx, ally, tx, ty = features(LABELLED), labels(LABELLED), features(TEST), labels(TEST)
    graph = defaultdict(list)
    for u, v in rng.integers(0, num_nodes - 5, (3 * num_nodes, 2)):  # the last 5 nodes: isolated
        graph[int(u)].append(int(v))
    graph[3] += [3, 4, 4]  # a self loop and a duplicate edge
    objects = {"x": allx[:TRAIN], "y": ally[:TRAIN], "allx": allx, "ally": ally, "tx": tx, "ty": ty, "graph": graph}
    files = {part: pickle.dumps(value, protocol=2) for part, value in objects.items()}
    files["test.index"] = "".join(f"{i}\n" for i in test_ids).encode()
    return files


def write_files(folder: Path, files: dict[str, bytes], name: str = "cora") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for part, content in files.items():
        (folder / f"ind.{name}.{part}").write_bytes(content)
    return folder


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_tiny_planetoid_files_load_as_pyg_reads_them(tmp_path, name):
    from torch_geometric.io.planetoid import read_planetoid_data

    folder = write_files(tmp_path, tiny_planetoid_files(seed=int(torch.randint(0, 2**30, ())), name=name), name)
    data = load_planetoid(name, folder)
    assert_same_as_pyg(data, read_planetoid_data(str(folder), name))
    assert data.num_classes == CLASSES and int(data.train_mask.sum()) == TRAIN


@pytest.mark.parametrize("part", PARTS)
def test_missing_file_is_named(tmp_path, part):
    folder = write_files(tmp_path, tiny_planetoid_files(seed=1))
    (folder / f"ind.cora.{part}").unlink()
    with pytest.raises(FileNotFoundError, match=f"ind.cora.{part}"):
        load_planetoid("cora", folder)


def test_only_pubmed_synthesises_missing_features(tmp_path):
    files = {k: v for k, v in tiny_planetoid_files(seed=2).items() if k not in ("allx", "tx")}
    pubmed = load_planetoid("pubmed", write_files(tmp_path / "p", files, "pubmed"))
    assert pubmed.synthetic_features and pubmed.x.shape == (LABELLED + TEST, 500)
    with pytest.raises(FileNotFoundError, match="ind.cora.allx"):
        load_planetoid("cora", write_files(tmp_path / "c", files))


def test_bad_name_and_root_arguments(tmp_path):
    with pytest.raises(ValueError, match="'reddit'"):
        load_planetoid("reddit", tmp_path)
    with pytest.raises(ValueError, match="name must be one of"):
        load_planetoid(None, tmp_path)
    with pytest.raises(FileNotFoundError, match="ind.cora.graph"):
        load_planetoid("cora", tmp_path / "nowhere")


class _RunsCode:
    def __reduce__(self):
        return (shutil.rmtree, ("/nonexistent-fusekit-path",))


WRONG_CONTENTS = [
    ("ally", pickle.dumps(["a", "b"]), "one-hot label array"),
    ("ty", pickle.dumps(np.zeros((TEST, CLASSES + 1))), "label columns"),
    ("y", pickle.dumps(np.zeros(TRAIN)), "2-D numeric"),
    ("allx", pickle.dumps({"rows": 3}), "numpy array or a CSR"),
    ("tx", pickle.dumps(sp.csr_matrix((TEST + 1, FEATURES))), f"{TEST} rows"),
    ("tx", pickle.dumps(sp.csr_matrix((TEST, FEATURES + 2))), "feature columns"),
    ("allx", pickle.dumps(sp.lil_matrix((LABELLED, FEATURES))), "CSR / CSC / COO"),
    ("allx", pickle.dumps(np.full((LABELLED, FEATURES), np.nan)), "NaN"),
    ("graph", pickle.dumps([1, 2, 3]), "dict of adjacency lists"),
    ("graph", pickle.dumps({0: [1, "two"]}), "lists of ints"),
    ("graph", pickle.dumps({0: [[1, 2]]}), "flat lists"),
    ("graph", pickle.dumps({0: [-4]}), "negative node id -4"),
    ("test.index", b"510\nfive hundred\n", "truncated or corrupted"),
    ("test.index", b"510\n511\n", f"expected {TEST} distinct test node ids"),
    ("y", pickle.dumps(_RunsCode()), "refusing to load shutil.rmtree"),
    ("graph", b"", "truncated or corrupted"),
]


@pytest.mark.parametrize("part, content, words", WRONG_CONTENTS, ids=[f"{p}-{w}" for p, _, w in WRONG_CONTENTS])
def test_wrong_contents_raise_a_format_error_naming_the_file(tmp_path, part, content, words):
    folder = write_files(tmp_path, {**tiny_planetoid_files(seed=3), part: content})
    with pytest.raises(PlanetoidFormatError, match=words) as info:
        load_planetoid("cora", folder)
    assert f"ind.cora.{part}" in str(info.value) and info.value.path == folder / f"ind.cora.{part}"


def test_csr_with_indices_outside_its_shape_is_refused_before_densifying(tmp_path):
    bad = sp.csr_matrix((TEST, FEATURES), dtype=np.float32)
    bad.indices = np.array([FEATURES + 1000], dtype=np.int32)  # bypasses scipy's constructor checks
    bad.data = np.ones(1, dtype=np.float32)
    bad.indptr = np.r_[0, np.ones(TEST, dtype=np.int32)].astype(np.int32)
    folder = write_files(tmp_path, {**tiny_planetoid_files(seed=4), "tx": pickle.dumps(bad)})
    with pytest.raises(PlanetoidFormatError, match="ind.cora.tx.*invalid matrix"):
        load_planetoid("cora", folder)


def check_loaded(data) -> None:
    """What any successful load promises, whatever the file contents were."""
    n = data.num_nodes
    assert data.x.shape[0] == n and data.x.dtype == torch.float32 and torch.isfinite(data.x).all()
    assert data.edge_index.shape[0] == 2 and (data.edge_index.numel() == 0 or int(data.edge_index.max()) < n)
    assert all(m.shape == (n,) for m in (data.train_mask, data.val_mask, data.test_mask))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    part=st.sampled_from(PARTS),
    kind=st.sampled_from(["truncate", "flip"]),
    where=st.floats(0.0, 1.0, exclude_max=True),
    byte=st.integers(0, 255),
)
def test_fuzzed_files_load_or_raise_an_error_naming_a_file(part, kind, where, byte):
    """Truncated files always fail; a flipped byte may still give a valid dataset, which must
    then satisfy the loader's promises.  Errors are PlanetoidFormatError naming a file."""
    files = tiny_planetoid_files(seed=5)
    content = bytearray(files[part])
    position = int(where * len(content))
    if kind == "truncate":
        content = content[:position]
    else:
        content[position] = byte
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_files(Path(tmp), {**files, part: bytes(content)})
        try:
            data = load_planetoid("cora", folder)
        except PlanetoidFormatError as exc:
            assert str(folder / "ind.cora.") in str(exc)
            if kind == "truncate" and part != "test.index":
                assert exc.path == folder / f"ind.cora.{part}"
            return
    assert kind == "flip" or part == "test.index"  # a truncated pickle never loads
    check_loaded(data)


def test_truncated_copy_of_real_cora_names_the_file(tmp_path):
    planetoid("cora")  # skips without the real files
    for part in ("x", *PARTS):
        shutil.copy(PLANETOID / f"ind.cora.{part}", tmp_path)
    allx = tmp_path / "ind.cora.allx"
    allx.write_bytes(allx.read_bytes()[: allx.stat().st_size // 2])
    with pytest.raises(PlanetoidFormatError, match="ind.cora.allx: truncated or corrupted"):
        load_planetoid("cora", tmp_path)
