"""Unfused PyTorch attention layers (GAT, GATv2, Graph Transformer, AGNN), one op at a time.

It is the benchmarks' baseline (what a user writes with gather / scatter in PyTorch) and,
in float64, the tests' oracle.  It materializes the per-edge scores ``[E, H]`` and the
gathered messages ``[E, H, D]`` — exactly what the fused kernels avoid.

Edges are taken in the graph's CSR order, so the attention-dropout mask, drawn from
:func:`fusecore.rng.uniform_reference` with stream = CSR position and position =
``offset + head``, is bit-identical to the kernels'.
"""

from __future__ import annotations

import torch

from fusecore.rng import uniform_reference

from .graph import Graph, as_graph


def dropout_keep_mask(graph: Graph, heads: int, dropout: float, seed: int, offset: int) -> torch.Tensor:
    """Boolean ``[E, H]`` (CSR order): which attention weights survive dropout."""
    positions = torch.arange(graph.num_edges, dtype=torch.int64).numpy()[:, None]
    heads_pos = offset + torch.arange(heads, dtype=torch.int64).numpy()[None, :]
    uniform = uniform_reference(seed, positions, heads_pos)[..., 0]
    return torch.from_numpy(uniform >= dropout).to(graph.device)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32 (as the kernels accumulate)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def edge_softmax_aggregate(
    graph: Graph, scores: torch.Tensor, messages: torch.Tensor, *, dropout: float = 0.0, seed: int = 0,
    offset: int = 0, weights: str | None = None, edge_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """``(out [N, H, D], lse [N, H])`` from per-edge ``scores [E, H]`` and ``messages [E, H, D]``
    in CSR order: ``α = softmax`` of the scores over each row's incoming edges (then dropout
    with scale ``1 / (1 − dropout)``, then times ``edge_weight [E]``, given in the graph's input edge
    order), ``out_i = Σ_j α_ij m_ij``.  Rows without incoming edges give zeros and ``lse = -inf``.
    Differentiable in the tensors.  ``weights`` ``"dropped"`` (the weights the sum used) or ``"softmax"``
    (before dropout and edge weight) appends ``α [E, H]`` in the graph's input edge order."""
    num_nodes, heads = graph.num_nodes, scores.shape[1]
    dtype, device = scores.dtype, scores.device
    dst = graph.csr_dst.long()
    row_max = torch.full((num_nodes, heads), float("-inf"), dtype=dtype, device=device)
    row_max = row_max.scatter_reduce(0, dst[:, None].expand_as(scores), scores.detach(), "amax")
    exp_scores = torch.exp(scores - row_max[dst])
    row_sum = torch.zeros(num_nodes, heads, dtype=dtype, device=device).index_add(0, dst, exp_scores)
    alpha = exp_scores / row_sum[dst]
    if dropout > 0:
        keep = dropout_keep_mask(graph, heads, dropout, seed, offset)
        alpha = torch.where(keep, alpha / (1.0 - dropout), torch.zeros_like(alpha))
    if edge_weight is not None:
        alpha = alpha * edge_weight.to(dtype)[graph.csr_eid.long()][:, None]
    weighted = alpha[:, :, None] * messages  # [E, H, D]
    out = torch.zeros(num_nodes, *messages.shape[1:], dtype=dtype, device=device).index_add(0, dst, weighted)
    lse = torch.where(row_sum > 0, row_max + torch.log(row_sum.clamp_min(1e-300)), torch.full_like(row_sum, -torch.inf))
    if weights is None:
        return out, lse.detach()
    if weights not in ("dropped", "softmax"):
        raise ValueError(f"weights must be None, 'dropped' or 'softmax', got {weights!r}")
    chosen = alpha if weights == "dropped" else exp_scores / row_sum[dst]
    in_order = torch.empty_like(chosen)
    in_order[graph.csr_eid.long()] = chosen
    return out, lse.detach(), in_order


def gat_attention_reference(
    graph,
    wh: torch.Tensor,
    el: torch.Tensor,
    er: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    seed: int = 0,
    offset: int = 0,
    weights: str | None = None,
    edge_weight: torch.Tensor | None = None,
    edge_score: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """``(out [N, H, D], lse [N, H])`` computed unfused in the dtype of ``el`` (differentiable).

    ``out_i = Σ_{j->i} α_ij Wh_j``, ``α_i· = softmax_j LeakyReLU(el_j + er_i (+ ee_ij))`` (then dropout
    with scale ``1 / (1 − dropout)``, then times ``edge_weight [E]``, DGL's); ``edge_score [E, H]``: the per-edge
    term ``ee`` in the graph's input edge order (PyG GATConv's ``edge_dim``); rows without incoming edges give zeros
    and ``lse = -inf``.
    """
    graph = as_graph(graph)
    src = graph.csr_src.long()
    dst = graph.csr_dst.long()
    z = el[src] + er[dst]  # [E, H]
    if edge_score is not None:
        z = z + edge_score.to(el.dtype)[graph.csr_eid.long()]
    scores = torch.nn.functional.leaky_relu(z, negative_slope)
    messages = wh.to(el.dtype)[src]  # [E, H, D]
    return edge_softmax_aggregate(graph, scores, messages, dropout=dropout, seed=seed, offset=offset, weights=weights,
                                  edge_weight=edge_weight)


def gatv2_reference(
    graph,
    feat_src: torch.Tensor,
    feat_dst: torch.Tensor,
    attn: torch.Tensor,
    edge_attr: torch.Tensor | None = None,
    edge_weight: torch.Tensor | None = None,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    seed: int = 0,
    offset: int = 0,
    weights: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """GATv2 (Brody et al., 2022): ``(out, lse)`` with ``out_i = Σ_{j->i} α_ij fs_j`` and
    ``α_i· = softmax_j Σ_d attn_hd · LeakyReLU(fs_j + fd_i (+ e_ij))_hd``; ``feat_src``, ``feat_dst``
    ``[N, H, D]``, ``attn`` ``H·D`` elements; ``edge_attr [E, K]`` (the graph's input edge order) with
    ``edge_weight [H·D, K]`` give PyG GATv2Conv's edge term ``e = edge_attr · edge_weightᵀ`` (in the score only),
    or both None.  Computed in float32 (float64 for float64 inputs),
    materializing the ``[E, H, D]`` edge vectors the fused kernel never stores."""
    graph = as_graph(graph)
    dtype = accumulation_dtype(feat_src.dtype)
    fs, fd = feat_src.to(dtype), feat_dst.to(dtype)
    src = graph.csr_src.long()
    dst = graph.csr_dst.long()
    heads, head_dim = fs.shape[1], fs.shape[2]
    z = fs[src] + fd[dst]
    if edge_attr is not None:
        edge = (edge_attr.to(dtype) @ edge_weight.to(dtype).t()).view(-1, heads, head_dim)
        z = z + edge[graph.csr_eid.long()]
    z = torch.nn.functional.leaky_relu(z, negative_slope)  # [E, H, D]
    scores = (z * attn.to(dtype).reshape(1, heads, head_dim)).sum(-1)
    return edge_softmax_aggregate(graph, scores, fs[src], dropout=dropout, seed=seed, offset=offset,
                                  weights=weights)


def transformer_attention_reference(
    graph,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    edge_attr: torch.Tensor | None = None,
    edge_weight: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    seed: int = 0,
    offset: int = 0,
    weights: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """Graph Transformer attention (PyG TransformerConv's message): ``(out, lse)`` with
    ``s_ij = scale · q_i · (k_j + e_ij)``, ``α = softmax_j s``, ``out_i = Σ_j α_ij (v_j + e_ij)``.

    ``query``, ``key``, ``value`` ``[N, H, D]``; ``edge_attr`` ``[E, K]`` in the graph's input
    edge order (as PyG's ``edge_attr``) and ``edge_weight`` ``[H·D, K]`` give ``e = edge_attr ·
    edge_weightᵀ`` (materialized ``[E, H, D]`` here), or both None; ``scale`` default ``1/√D``.
    """
    graph = as_graph(graph)
    dtype = accumulation_dtype(value.dtype)
    num_heads, head_dim = value.shape[1], value.shape[2]
    scale = head_dim ** -0.5 if scale is None else scale
    src = graph.csr_src.long()
    dst = graph.csr_dst.long()
    keys, values = key.to(dtype)[src], value.to(dtype)[src]
    if edge_attr is not None:
        edge = (edge_attr.to(dtype) @ edge_weight.to(dtype).t()).view(-1, num_heads, head_dim)
        edge_csr = edge[graph.csr_eid.long()]
        keys, values = keys + edge_csr, values + edge_csr
    scores = scale * (query.to(dtype)[dst] * keys).sum(-1)
    return edge_softmax_aggregate(graph, scores, values, dropout=dropout, seed=seed, offset=offset,
                                  weights=weights)


def agnn_reference(graph, feat: torch.Tensor, beta: torch.Tensor, weights: bool = False
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """AGNN propagation (Thekumparampil et al., 2018; DGL's AGNNConv): ``out_i = Σ_{j->i} α_ij h_j``
    with ``α_i· = softmax_j β cos(h_i, h_j)``; ``feat`` ``[N, D]`` (or ``[N, H, D]``: per head),
    ``beta`` one element.  Returns ``feat``'s shape in the compute dtype (with ``weights``, and ``α
    [E, H]`` in the input edge order, ``H = 1`` for ``[N, D]`` features)."""
    graph = as_graph(graph)
    dtype = accumulation_dtype(feat.dtype)
    h = feat.to(dtype) if feat.dim() == 3 else feat.to(dtype).unsqueeze(1)
    unit = torch.nn.functional.normalize(h, p=2, dim=-1)
    src = graph.csr_src.long()
    dst = graph.csr_dst.long()
    scores = beta.to(dtype).reshape(()) * (unit[dst] * unit[src]).sum(-1)  # [E, H]
    if weights:
        out, _, alpha = edge_softmax_aggregate(graph, scores, h[src], weights="softmax")
        return out.reshape(feat.shape), alpha
    out, _ = edge_softmax_aggregate(graph, scores, h[src])
    return out.reshape(feat.shape)
