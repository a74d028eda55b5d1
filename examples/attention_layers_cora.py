"""Train a 2-layer GATv2, Graph Transformer or AGNN model on Cora with gnnfuse's fused layers.

    python examples/attention_layers_cora.py --layer gatv2          # GPU: 200 epochs
    python examples/attention_layers_cora.py --layer transformer    # with 4 edge features per edge
    python examples/attention_layers_cora.py --layer agnn --epochs 5  # CPU (Triton interpreter): short runs
    python examples/attention_layers_cora.py --reference            # the same model, unfused PyTorch path

Models (standard Planetoid split, self loops added, Adam lr 0.005, weight decay 5e-4, dropout 0.6):

* ``gatv2``: GATv2Conv(8 heads × 8, ELU) → GATv2Conv(1 head, classes);
* ``transformer``: GraphTransformerConv(8 heads × 8, edge_dim=4, ELU) → GraphTransformerConv(classes,
  edge_dim=4); the edge features are [is self loop, 1/deg(src), 1/deg(dst), 1] (Cora has none);
* ``agnn``: Linear(16, ReLU) → AGNNConv → AGNNConv → Linear(classes) (the AGNN paper's propagation).

The best-validation epoch's test accuracy is printed.
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
from gnnfuse import Graph  # noqa: E402
from gnnfuse.datasets import default_planetoid_root, load_planetoid  # noqa: E402
from gnnfuse.nn import AGNNConv, GATv2Conv, GraphTransformerConv  # noqa: E402

EDGE_DIM = 4


def edge_features(graph: Graph) -> torch.Tensor:
    """[is self loop, 1/out-degree of the source, 1/in-degree of the destination, 1] per edge (input order)."""
    src, dst = graph.edge_index
    out_degree = graph.out_degree.clamp_min(1).float()
    in_degree = graph.in_degree.clamp_min(1).float()
    return torch.stack([(src == dst).float(), 1 / out_degree[src], 1 / in_degree[dst], torch.ones_like(src).float()], 1)


class Model(torch.nn.Module):
    def __init__(self, layer: str, in_feats: int, classes: int, dropout: float = 0.6):
        super().__init__()
        self.layer = layer
        self.dropout = torch.nn.Dropout(dropout)
        if layer == "gatv2":
            self.conv1 = GATv2Conv(in_feats, 8, 8, feat_drop=dropout, attn_drop=dropout,
                                   activation=torch.nn.functional.elu)
            self.conv2 = GATv2Conv(64, classes, 1, feat_drop=dropout, attn_drop=dropout)
        elif layer == "transformer":
            self.conv1 = GraphTransformerConv(in_feats, 8, heads=8, dropout=dropout, edge_dim=EDGE_DIM)
            self.conv2 = GraphTransformerConv(64, classes, dropout=dropout, edge_dim=EDGE_DIM)
        else:
            self.lin1 = torch.nn.Linear(in_feats, 16)
            self.conv1 = AGNNConv(learn_beta=False)
            self.conv2 = AGNNConv()
            self.lin2 = torch.nn.Linear(16, classes)

    def forward(self, graph: Graph, x: torch.Tensor, edge_feat: torch.Tensor) -> torch.Tensor:
        if self.layer == "gatv2":
            return self.conv2(graph, self.conv1(graph, x).flatten(1)).mean(1)
        if self.layer == "transformer":
            h = torch.nn.functional.elu(self.conv1(graph, self.dropout(x), edge_feat))
            return self.conv2(graph, self.dropout(h), edge_feat)
        h = torch.relu(self.lin1(self.dropout(x)))
        h = self.conv2(graph, self.conv1(graph, h))
        return self.lin2(self.dropout(h))


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", choices=("gatv2", "transformer", "agnn"), default="gatv2")
    parser.add_argument("--data", type=Path, default=None, help="folder with the raw Planetoid files")
    parser.add_argument("--epochs", type=int, default=None, help="default: 200 on a GPU, 10 on the CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference", action="store_true", help="run the unfused PyTorch reference path")
    args = parser.parse_args(argv)
    with backend.use_reference(args.reference):  # for this run only: main() may be called from other code
        return _train(args)


def _train(args: argparse.Namespace) -> float:
    device = backend.default_device()
    epochs = args.epochs or (200 if device.type == "cuda" else 10)
    torch.manual_seed(args.seed)

    data = load_planetoid("cora", args.data or default_planetoid_root())
    x = (data.x / data.x.sum(1, keepdim=True).clamp_min(1.0)).to(device)
    y = data.y.to(device)
    graph = Graph(data.edge_index.to(device), data.num_nodes).remove_self_loops().add_self_loops()
    edge_feat = edge_features(graph).to(device)
    model = Model(args.layer, x.shape[1], data.num_classes).to(device)
    masks = {k: getattr(data, f"{k}_mask").to(device) for k in ("train", "val", "test")}
    print(f"Cora, {args.layer}: {graph}, {backend.describe()}, device {device}, {epochs} epochs", flush=True)

    return train_node_classifier(model, lambda: model(graph, x, edge_feat), y, masks, epochs)


if __name__ == "__main__":
    main()
