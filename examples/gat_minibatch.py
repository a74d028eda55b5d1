"""Train a 2-layer GAT on sampled mini-batches (bipartite layer calls), as large graphs are trained.

    python examples/gat_minibatch.py                          # GPU: Cora, 100 epochs, batches of 64, fanouts 10, 10
    python examples/gat_minibatch.py --dataset pubmed         # a larger Planetoid graph
    python examples/gat_minibatch.py --epochs 2               # CPU (Triton interpreter): a short run

Each step takes a batch of training nodes, samples up to ``fanout`` incoming edges per node for the
second layer and again for the first (uniformly, without replacement), and runs the layers on the two
bipartite blocks: ``conv(edge_index, (x_src, x_dst))`` with edges from a block's sources to its
destinations, the destinations being the first sources (DGL's block convention; a DGL block itself is
taken the same way).  Evaluation runs the same layers on the whole graph (ordinary calls).  The graph
has one self loop per node, so every destination keeps at least its own edge.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gat_cora import GAT as FullGraphGAT  # noqa: E402
from planetoid_training import train_node_classifier  # noqa: E402

from fusecore import backend  # noqa: E402
from gnnfuse import Graph  # noqa: E402
from gnnfuse.datasets import default_planetoid_root, load_planetoid  # noqa: E402


class GAT(FullGraphGAT):
    """gat_cora's model (its ``forward`` runs the whole graph), plus the same layers on sampled blocks."""

    def forward_blocks(self, blocks: list[tuple[torch.Tensor, int]], x_src: torch.Tensor) -> torch.Tensor:
        """Sampled blocks ``[(edge_index, num_dst), ...]`` from the first layer's to the last's; ``x_src`` the
        first block's source features.  Each block's destinations are the first rows of its sources."""
        h = x_src
        for conv, (edges, num_dst) in zip((self.conv1, self.conv2), blocks):
            h = conv(edges, (h, h[:num_dst]))
            h = h.flatten(1) if conv is self.conv1 else h.mean(1)
        return h


def sample_block(graph: Graph, dst: torch.Tensor, fanout: int, gen: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``fanout`` incoming edges of each node of ``dst`` (uniform, without replacement).  Returns the
    block's source nodes (``dst`` first, then the new sources; global ids) and its edges ``[2, E]`` in the
    block's ids (sources index the returned nodes, destinations index ``dst``)."""
    starts = graph.indptr[dst].long()
    degrees = graph.indptr[dst + 1].long() - starts
    segment = torch.repeat_interleave(torch.arange(dst.numel(), device=dst.device), degrees)
    first = torch.cumsum(degrees, 0) - degrees
    positions = starts[segment] + torch.arange(segment.numel(), device=dst.device) - first[segment]
    keys = torch.rand(segment.numel(), generator=gen).to(dst.device)
    order = torch.argsort(segment.double() + keys.double())  # by destination, then a random key
    rank = torch.arange(order.numel(), device=dst.device) - first[segment[order]]
    kept = order[rank < fanout]
    src_global = graph.csr_src[positions[kept]].long()
    local = torch.full((graph.num_nodes,), -1, dtype=torch.long, device=dst.device)
    local[dst] = torch.arange(dst.numel(), device=dst.device)
    new = torch.unique(src_global[local[src_global] < 0])
    local[new] = torch.arange(dst.numel(), dst.numel() + new.numel(), device=dst.device)
    nodes = torch.cat([dst, new])
    return nodes, torch.stack([local[src_global], segment[kept]])


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="folder with the raw Planetoid files (default: $FUSEKIT_DATASETS/planetoid or "
                        "../shared/datasets/planetoid)")
    parser.add_argument("--dataset", default="cora", choices=["cora", "citeseer", "pubmed"])
    parser.add_argument("--epochs", type=int, default=None, help="default: 100 on a GPU, 2 on the CPU")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--fanouts", type=int, nargs=2, default=[10, 10], help="first layer, second layer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = backend.default_device()
    epochs = args.epochs or (100 if device.type == "cuda" else 2)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    data = load_planetoid(args.dataset, args.data or default_planetoid_root())
    x = data.x / data.x.sum(1, keepdim=True).clamp_min(1.0)
    x, y = x.to(device), data.y.to(device)
    graph = Graph(data.edge_index.to(device), data.num_nodes).add_self_loops()
    masks = {k: getattr(data, f"{k}_mask").to(device) for k in ("train", "val", "test")}
    model = GAT(x.shape[1], 8, 8, data.num_classes).to(device)
    train_nodes = masks["train"].nonzero().flatten()
    print(f"{args.dataset}: {graph}, {backend.describe()}, device {device}, {epochs} epochs, batches of "
          f"{args.batch}, fanouts {args.fanouts}", flush=True)

    def train_epoch(optimizer: torch.optim.Optimizer) -> torch.Tensor:
        order = train_nodes[torch.randperm(train_nodes.numel(), generator=gen).to(device)]
        for seeds in order.split(args.batch):
            nodes2, edges2 = sample_block(graph, seeds, args.fanouts[1], gen)   # the second layer's block
            nodes1, edges1 = sample_block(graph, nodes2, args.fanouts[0], gen)  # the first layer's, for its sources
            logits = model.forward_blocks([(edges1, nodes2.numel()), (edges2, seeds.numel())], x[nodes1])
            loss = torch.nn.functional.cross_entropy(logits, y[seeds])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss

    return train_node_classifier(model, lambda: model(graph, x), y, masks, epochs, train_epoch=train_epoch)


if __name__ == "__main__":
    main()
