"""Time the attention-weights pass alone (``gnnfuse.ops.attention_weights``) under several tilings, on a GPU.

    python3 tests/gnnfuse/weights_sweep.py [--graph arxiv-like] [--blocks 16,32,64,128,256] [--warps 2,4,8]

For each score kind (GAT, GATv2, dot, dot with 16 edge features, AGNN's cosine) and dtype (fp32, bf16), the
pass on the inputs and ``lse`` of one forward, every (positions per program, warps) pair: median µs of CUDA-event
timings (``triton.testing.do_bench``), the fraction of the pass's floor
(:func:`gnnfuse.ops.attention_weights_floor_bytes` over the device's copy rate), and the weights checked
against the default tiling's.  The rows to set :data:`gnnfuse.ops.ATTENTION_WEIGHTS_BLOCK` /
``ATTENTION_WEIGHTS_WARPS`` from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import ab_layers  # noqa: E402

from fusecore.device import device_facts  # noqa: E402
from gnnfuse import Graph, ops  # noqa: E402
from gnnfuse.kernels.scores import SCORE_DOT, SCORE_GAT, SCORE_GATV2  # noqa: E402

EDGE_DIM = 16


def _inputs(kind: str, graph: Graph, heads: int, dim: int, dtype: torch.dtype, gen: torch.Generator):
    n = graph.num_nodes

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=graph.device, dtype=dtype)

    a, b, c = rand(n, heads, dim), rand(n, heads, dim), rand(n, heads, dim)
    if kind == "gat":
        el, er = ops.node_scores(a, rand(1, heads, dim), rand(1, heads, dim))
        return ops.AttentionInputs(SCORE_GAT, el, er, a), dict(node_terms=True)
    if kind == "gatv2":
        return ops.AttentionInputs(SCORE_GATV2, a, b, a, attn=rand(heads, dim)), {}
    if kind == "dot":
        return ops.AttentionInputs(SCORE_DOT, b, a, c, scale=dim ** -0.5), {}
    if kind == "edge":
        attr, weight = rand(graph.num_edges, EDGE_DIM), rand(EDGE_DIM, heads, dim) / 4
        return (ops.AttentionInputs(SCORE_DOT, b, a, c, edge_attr=attr, edge_weight=weight, scale=dim ** -0.5),
                dict(edge_elements=EDGE_DIM))
    inverse_norm, query_scale = ops._normalize_rows(a, torch.ones(1, device=graph.device, dtype=dtype))
    return ops.AttentionInputs(SCORE_DOT, inverse_norm, query_scale, a, keys_from_values=True), {}


def main(argv: list[str] | None = None) -> int:
    import triton.testing

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="arxiv-like")
    parser.add_argument("--blocks", default="16,32,64,128,256")
    parser.add_argument("--warps", default="2,4,8")
    parser.add_argument("--kinds", default="gat,gatv2,dot,edge,cosine")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    from benchmarks.cases.gnn import _edges

    edges, num_nodes = _edges(args.graph, device)
    graph = Graph(edges, num_nodes)
    heads, dim = ab_layers.graph_shape(args.graph)[1:3]
    rate = device_facts(device).peak.bandwidth
    gen = torch.Generator().manual_seed(0)
    blocks = [int(b) for b in args.blocks.split(",")]
    warps = [int(w) for w in args.warps.split(",")]
    print(f"graph {args.graph}: {num_nodes} nodes, {graph.num_edges} edges, {heads} x {dim}")
    for dtype in (torch.float32, torch.bfloat16):
        for kind in args.kinds.split(","):
            inputs, floor_kw = _inputs(kind, graph, heads, dim, dtype, gen)
            _, lse = ops.attention_forward(graph, inputs, 0.0, 0, 0, None)
            floor_us = ops.attention_weights_floor_bytes(graph, heads, dim, dtype, **floor_kw) / rate * 1e6
            expected = ops.attention_weights(graph, inputs, lse, 0.0, 0, 0, None)
            key = "edge" if kind == "edge" else {"gat": SCORE_GAT, "gatv2": SCORE_GATV2, "dot": SCORE_DOT,
                                                  "cosine": ops.LIGHT_COSINE}[kind]
            width = torch.empty((), dtype=dtype).element_size()
            for block in blocks:
                for warp in warps:
                    ops.ATTENTION_WEIGHTS_BLOCK[key] = {width: block}
                    ops.ATTENTION_WEIGHTS_WARPS[key] = {width: warp}
                    try:
                        got = ops.attention_weights(graph, inputs, lse, 0.0, 0, 0, None)
                        error = (got.float() - expected.float()).abs().max().item()
                        us = triton.testing.do_bench(
                            lambda inputs=inputs, lse=lse: ops.attention_weights(graph, inputs, lse, 0.0, 0, 0, None),
                            warmup=25, rep=200,
                            return_mode="median") * 1e3
                        print(f"{str(dtype)[6:]:8} {kind:7} block {block:4d} warps {warp}: {us:8.1f} us  "
                              f"{100 * floor_us / us:5.1f}% of {floor_us:.1f} us floor  max diff {error:.2e}",
                              flush=True)
                    except Exception as exc:  # noqa: BLE001 - a tiling that does not compile is a row too
                        print(f"{str(dtype)[6:]:8} {kind:7} block {block:4d} warps {warp}: failed: "
                              f"{type(exc).__name__}: {str(exc)[:160]}", flush=True)
            ops.ATTENTION_WEIGHTS_BLOCK.pop(key, None)
            ops.ATTENTION_WEIGHTS_WARPS.pop(key, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
