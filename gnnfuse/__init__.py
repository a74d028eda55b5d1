"""gnnfuse: fused attention-GNN layers in Triton.

* :class:`Graph` — CSR by destination, reverse CSR by source, degree buckets and cached
  schedules (:mod:`gnnfuse.graph`, :mod:`gnnfuse.schedule`);
* :mod:`gnnfuse.ops` — the fused attentions, one code path for every score (GAT:
  :func:`~gnnfuse.ops.gat`, :func:`~gnnfuse.ops.gat_attention`; GATv2:
  :func:`~gnnfuse.ops.gatv2`; Graph Transformer with edge features:
  :func:`~gnnfuse.ops.transformer_attention`; AGNN: :func:`~gnnfuse.ops.agnn`), forward
  storing only the logsumexp, backward without atomics;
* :mod:`gnnfuse.nn` — :class:`~gnnfuse.nn.GATConv` and :class:`~gnnfuse.nn.GATv2Conv` (DGL's
  layers and state_dicts), :class:`~gnnfuse.nn.GraphTransformerConv` (PyG's TransformerConv
  state_dict), :class:`~gnnfuse.nn.AGNNConv` (DGL's);
* :mod:`gnnfuse.pyg` — PyG's ``GATConv``, ``GATv2Conv``, ``TransformerConv`` and ``AGNNConv`` as drop-in
  replacements (PyG's constructor arguments, state_dict names and ``forward(x, edge_index, ...)``);
* :func:`capture` — a layer on one fixed graph replayed from CUDA graphs, forward and backward
  (:mod:`gnnfuse.cuda_graph`: full-graph training without the host's launch work);
* :mod:`gnnfuse.reference` — the same math unfused in PyTorch (baseline and oracle);
* :mod:`gnnfuse.datasets` — Planetoid loader and reproducible power-law graphs.

Example::

    import gnnfuse
    from gnnfuse.nn import GATConv

    graph = gnnfuse.Graph(edge_index, num_nodes).add_self_loops()   # CSR + reverse CSR, once
    conv = GATConv(in_feats=1433, out_feats=8, num_heads=8).cuda()   # DGL's parameters
    out = conv(graph, x)                                             # [N, 8, 8]

    # functional form, own projections: wh [N, H, D], attn_l / attn_r (1, H, D)
    out = gnnfuse.ops.gat(graph, wh, attn_l, attn_r, negative_slope=0.2, dropout=0.1)

    # the rest of the family on the same graph object and kernels
    from gnnfuse.nn import AGNNConv, GATv2Conv, GraphTransformerConv
    out = GATv2Conv(1433, 8, num_heads=8).cuda()(graph, x)                    # [N, 8, 8]
    conv = GraphTransformerConv(1433, 8, heads=8, edge_dim=4).cuda()          # PyG TransformerConv's parameters
    out = conv(graph, x, edge_feat)                                           # [N, 64]; edge_feat [E, 4]
    out = AGNNConv()(graph, h)                                                # [N, D]
"""

import fusecore  # noqa: F401  (fixes the kernel mode before any gnnfuse kernel is defined)

from . import nn, ops, pyg, reference
from .cuda_graph import CapturedLayer, capture
from .graph import Graph, as_graph
from .schedule import Schedule, ScheduleOptions

__all__ = [
    "CapturedLayer", "Graph", "as_graph", "capture", "Schedule", "ScheduleOptions", "nn", "ops", "pyg", "reference",
]
