"""Planetoid loader against PyG's reader; the power-law generator's reproducibility and shape."""

import pytest
import torch
from gnn_testing import PLANETOID, planetoid

from gnnfuse.datasets import power_law_graph


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_planetoid_matches_pyg_public_split(name):
    data = planetoid(name)
    from torch_geometric.io.planetoid import read_planetoid_data

    pyg = read_planetoid_data(str(PLANETOID), name)
    assert torch.equal(data.x, pyg.x) and torch.equal(data.y, pyg.y)
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(data, mask), getattr(pyg, mask))
    ours = torch.sort(data.edge_index[0] * data.num_nodes + data.edge_index[1]).values
    theirs = torch.sort(pyg.edge_index[0] * data.num_nodes + pyg.edge_index[1]).values
    assert torch.equal(ours, theirs)
    assert not data.synthetic_features


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
