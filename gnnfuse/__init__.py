"""gnnfuse: fused attention-GNN layers in Triton.

* :class:`Graph` — CSR by destination, reverse CSR by source, degree buckets and cached
  schedules (:mod:`gnnfuse.graph`, :mod:`gnnfuse.schedule`);
* :mod:`gnnfuse.ops` — the fused GAT attention (:func:`~gnnfuse.ops.gat`,
  :func:`~gnnfuse.ops.gat_attention`), forward storing only the logsumexp, backward without
  atomics;
* :mod:`gnnfuse.nn` — :class:`~gnnfuse.nn.GATConv`, DGL's layer and state_dict;
* :mod:`gnnfuse.reference` — the same math unfused in PyTorch (baseline and oracle);
* :mod:`gnnfuse.datasets` — Planetoid loader and reproducible power-law graphs.
"""

import fusecore  # noqa: F401  (fixes the kernel mode before any gnnfuse kernel is defined)

from . import nn, ops, reference
from .graph import Graph, as_graph
from .schedule import Schedule, ScheduleOptions

__all__ = ["Graph", "as_graph", "Schedule", "ScheduleOptions", "nn", "ops", "reference"]
