"""The Planetoid examples run end to end: a short training run on real Cora per layer kind
(skipped when the dataset folder is absent)."""

import importlib
import math
import sys
from pathlib import Path

import pytest
from gnn_testing import PLANETOID, planetoid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.mark.parametrize("argv", [
    ["--reference", "--epochs", "2"],
    ["--epochs", "1"],
])
def test_gat_cora_trains(argv, capsys):
    planetoid("cora")  # skips without the dataset
    accuracy = _example("gat_cora").main(["--data", str(PLANETOID), *argv])
    assert 0.0 <= accuracy <= 1.0 and not math.isnan(accuracy)
    out = capsys.readouterr().out
    assert "test accuracy at the best validation epoch" in out
    report = out.split("layer-1 attention entropy per head (nats, mean over nodes): ")[1].splitlines()[0]
    heads, uniform = report.split("; uniform ")
    entropies = [float(v) for v in heads.split(", ")]
    # a softmax over d neighbours has entropy in [0, log d]: the mean lies in [0, mean log d]
    assert len(entropies) == 8 and all(0.0 <= h <= float(uniform) + 1e-3 for h in entropies)


@pytest.mark.parametrize("layer", ["gatv2", "transformer", "agnn"])
def test_attention_layers_cora_trains(layer, capsys):
    planetoid("cora")
    accuracy = _example("attention_layers_cora").main(["--layer", layer, "--epochs", "1", "--data",
                                                       str(PLANETOID)])
    assert 0.0 <= accuracy <= 1.0 and not math.isnan(accuracy)
    assert f"Cora, {layer}" in capsys.readouterr().out


def test_gat_minibatch_trains_on_sampled_blocks(capsys):
    planetoid("cora")
    accuracy = _example("gat_minibatch").main(["--epochs", "1", "--batch", "70", "--data", str(PLANETOID)])
    assert 0.0 <= accuracy <= 1.0 and not math.isnan(accuracy)
    assert "test accuracy at the best validation epoch" in capsys.readouterr().out


def test_neighbour_sampler_draws_real_edges_without_replacement():
    import torch

    from gnnfuse import Graph

    sample_block = _example("gat_minibatch").sample_block
    gen = torch.Generator().manual_seed(1)
    edges = torch.randint(0, 40, (2, 400), generator=gen)
    edges = edges[:, edges[0] != edges[1]]
    graph = Graph(edges, 40).add_self_loops()
    dst = torch.tensor([3, 17, 0, 39, 8])
    nodes, block = sample_block(graph, dst, 4, gen)
    assert torch.equal(nodes[: dst.numel()], dst) and nodes.unique().numel() == nodes.numel()
    from collections import Counter

    in_graph = Counter(zip(graph.edge_index[0].tolist(), graph.edge_index[1].tolist()))
    counts = torch.bincount(block[1], minlength=dst.numel())
    for i, node in enumerate(dst.tolist()):
        assert counts[i] == min(4, int(graph.in_degree[node]))
    drawn = Counter((int(nodes[s]), int(dst[d])) for s, d in zip(block[0].tolist(), block[1].tolist()))
    # real edges, none drawn more often than the graph holds it (without replacement; duplicates may repeat)
    assert all(in_graph[pair] >= times for pair, times in drawn.items())


def test_pyg_cora_trains_with_a_sparse_adjacency_and_matches_pyg(capsys):
    """The PyG example on the fused drop-ins with PyG's ``adj_t`` as a torch.sparse CSR tensor: it trains, and the
    same model built from torch_geometric.nn loads its state_dict and gives the same logits."""
    planetoid("cora")
    pytest.importorskip("torch_geometric")
    accuracy = _example("pyg_cora").main(["--conv", "gat", "--adj", "csr", "--epochs", "1", "--data",
                                          str(PLANETOID)])
    assert 0.0 <= accuracy <= 1.0 and not math.isnan(accuracy)
    out = capsys.readouterr().out
    assert "GATConv from gnnfuse.pyg, csr" in out
    difference, scale = out.split("max |difference| ")[1].split(" (logits up to ")
    assert float(difference) <= 1e-4 * max(1.0, float(scale.split(")")[0]))
