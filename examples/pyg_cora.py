"""A PyG model on Cora with its import changed: ``gnnfuse.pyg``'s layers in place of ``torch_geometric.nn``'s.

    python examples/pyg_cora.py --conv gatv2 --edge-dim 4       # GPU: 200 epochs
    python examples/pyg_cora.py --adj csr                        # PyG's sparse adj_t instead of edge_index
    python examples/pyg_cora.py --epochs 3                       # CPU (Triton interpreter): short runs

The model is PyG's GAT example (``examples/gat.py`` of torch_geometric): ``conv(in, 8, heads=8, dropout=0.6)``,
ELU, ``conv(64, classes, heads=1, concat=False, dropout=0.6)``, dropout 0.6 on the features, Adam (lr 0.005,
weight decay 5e-4), written once against a module of layers — ``gnnfuse.pyg`` or, with ``--pyg``,
``torch_geometric.nn`` itself.  ``--conv``: ``gat``, ``gatv2`` or ``transformer`` (TransformerConv adds no self
loops: the graph's own edges only).  ``--edge-dim K``: PyG's ``edge_dim`` with K features per edge ([is a citation
of a higher id, 1/deg(src), 1/deg(dst), 1], repeated to K).  ``--adj``: the graph as PyG's ``edge_index``, or as the
transposed adjacency ``adj_t`` in a ``torch.sparse`` CSR or COO tensor (what ``T.ToSparseTensor`` users pass).

Before training, unless ``--pyg``, a twin model of ``torch_geometric.nn``'s layers (when PyG is installed) loads
the fused model's state_dict unchanged and both run once in eval mode: the largest difference of their logits is
printed.  The best-validation epoch's test accuracy is reported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planetoid_training import train_node_classifier  # noqa: E402

from fusecore import backend  # noqa: E402
from gnnfuse.datasets import default_planetoid_root, load_planetoid  # noqa: E402

CONVS = {"gat": "GATConv", "gatv2": "GATv2Conv", "transformer": "TransformerConv"}


class Net(torch.nn.Module):
    """PyG's GAT example with any of its attention convolutions, built from the layer module ``layers``."""

    def __init__(self, layers, conv: str, in_channels: int, classes: int, edge_dim: int | None,
                 dropout: float = 0.6):
        super().__init__()
        cls = getattr(layers, CONVS[conv])
        extra = {} if edge_dim is None else {"edge_dim": edge_dim}
        self.dropout = dropout
        self.conv1 = cls(in_channels, 8, heads=8, dropout=dropout, **extra)
        self.conv2 = cls(8 * 8, classes, heads=1, concat=False, dropout=dropout, **extra)

    def forward(self, x: torch.Tensor, edge_index, edge_attr: torch.Tensor | None = None) -> torch.Tensor:
        extra = () if edge_attr is None else (edge_attr,)
        x = torch.nn.functional.dropout(x, p=self.dropout, training=self.training)
        x = torch.nn.functional.elu(self.conv1(x, edge_index, *extra))
        x = torch.nn.functional.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index, *extra)


def edge_features(edge_index: torch.Tensor, num_nodes: int, width: int) -> torch.Tensor:
    """``[E, width]`` per edge ``j -> i`` (the edges' order): [j > i, 1/out-degree of j, 1/in-degree of i, 1],
    repeated to ``width`` columns."""
    src, dst = edge_index
    out_degree = torch.bincount(src, minlength=num_nodes).clamp_min(1).float()
    in_degree = torch.bincount(dst, minlength=num_nodes).clamp_min(1).float()
    base = torch.stack([(src > dst).float(), 1 / out_degree[src], 1 / in_degree[dst], torch.ones_like(src).float()], 1)
    return base.repeat(1, -(-width // 4))[:, :width].contiguous()


def adjacency(edge_index: torch.Tensor, num_nodes: int, kind: str):
    """The graph as the layers take it: ``edge_index`` itself, or PyG's ``adj_t`` (``adj_t[i, j]``: the edge ``j ->
    i``) as a coalesced ``torch.sparse`` COO or CSR tensor — then edge features follow its order, so the edges are
    returned in it too."""
    if kind == "edge_index":
        return edge_index, edge_index
    adj = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.shape[1], device=edge_index.device),
                                  (num_nodes, num_nodes)).coalesce()
    ordered = adj.indices().flip(0)  # the stored entries' edges j -> i, in storage (row-major) order
    return (adj if kind == "coo" else adj.to_sparse_csr()), ordered


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="folder with the raw Planetoid files (default: $FUSEKIT_DATASETS/planetoid or "
                        "../shared/datasets/planetoid)")
    parser.add_argument("--conv", choices=sorted(CONVS), default="gat")
    parser.add_argument("--edge-dim", type=int, default=None, help="edge features per edge (PyG's edge_dim)")
    parser.add_argument("--adj", choices=["edge_index", "csr", "coo"], default="edge_index")
    parser.add_argument("--epochs", type=int, default=None, help="default: 200 on a GPU, 20 on the CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pyg", action="store_true", help="train the same model built from torch_geometric.nn")
    args = parser.parse_args(argv)
    if args.edge_dim is not None and args.edge_dim < 1:
        parser.error(f"--edge-dim must be a positive integer, got {args.edge_dim}")
    if args.edge_dim is not None and args.adj != "edge_index" and args.conv != "transformer":
        parser.error("--edge-dim with a sparse --adj needs --conv transformer: PyG's sparse add_self_loops takes no "
                     "edge features (GATConv and GATv2Conv add self loops)")
    return _train(args)


def _train(args: argparse.Namespace) -> float:
    device = backend.default_device()
    epochs = args.epochs or (200 if device.type == "cuda" else 20)
    torch.manual_seed(args.seed)
    data = load_planetoid("cora", args.data or default_planetoid_root())
    x = (data.x / data.x.sum(1, keepdim=True).clamp_min(1.0)).to(device)  # row-normalized bag of words
    y = data.y.to(device)
    masks = {k: getattr(data, f"{k}_mask").to(device) for k in ("train", "val", "test")}
    graph, edges = adjacency(data.edge_index.to(device), data.num_nodes, args.adj)
    edge_attr = None if args.edge_dim is None else edge_features(edges, data.num_nodes, args.edge_dim)

    if args.pyg:
        import torch_geometric.nn as layers
    else:
        from gnnfuse import pyg as layers
    model = Net(layers, args.conv, x.shape[1], data.num_classes, args.edge_dim).to(device)
    print(f"Cora, {CONVS[args.conv]} from {layers.__name__}, {args.adj}"
          f"{'' if args.edge_dim is None else f', edge_dim={args.edge_dim}'}, {backend.describe()}, device {device}, "
          f"{epochs} epochs", flush=True)
    if not args.pyg:
        compare_with_pyg(model, args, x, graph, edge_attr, data.num_classes)
    return train_node_classifier(model, lambda: model(x, graph, edge_attr), y, masks, epochs)


def compare_with_pyg(model: Net, args: argparse.Namespace, x: torch.Tensor, graph, edge_attr, classes: int) -> None:
    """``torch_geometric.nn``'s twin of ``model`` loads its state_dict as is; both run once in eval mode."""
    try:
        import torch_geometric.nn as pyg_layers
    except ImportError:
        print("torch_geometric is not installed: no comparison with PyG's layers")
        return
    twin = Net(pyg_layers, args.conv, x.shape[1], classes, args.edge_dim).to(x.device)
    twin.load_state_dict(model.state_dict())
    model.eval(), twin.eval()
    with torch.no_grad():
        ours, theirs = model(x, graph, edge_attr), twin(x, graph, edge_attr)
    model.train()
    print(f"logits against torch_geometric.nn's {CONVS[args.conv]} with the same state_dict: max |difference| "
          f"{(ours - theirs).abs().max().item():.3e} (logits up to {theirs.abs().max().item():.3e})", flush=True)


if __name__ == "__main__":
    main()
