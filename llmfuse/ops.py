"""Launchers of the fused decode kernels: block sizes and grids chosen, shapes checked.

A :class:`DecodePlan` fixes every block size, the number of attention splits and the
looped kernel's grid once per (config, batch, cache length, dtype, device); a
:class:`DecodeBuffers` holds the static activations one decode step reads and writes
(the residual ``x`` in float32, ``q``, attention partials, the MLP activation ``h``,
logits and greedy winners, the cache slot and per-row first valid slot on the device),
so a whole step — per-layer launches or the looped launch — is capturable in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from fusecore import backend
from fusecore.device import device_facts
from fusecore.plan import PlanCache, cdiv, next_power_of_2, persistent_grid

from .config import LlamaConfig
from .kernels.decode_attention import decode_attention_kernel
from .kernels.embed import embed_kernel
from .kernels.gate_up import gate_up_kernel
from .kernels.lm_head import lm_head_kernel, pick_kernel
from .kernels.looped import COUNT_LINE, DONE_COUNTS, STAGES_PER_LAYER, looped_decode_kernel
from .kernels.matvec import SMALL_BATCH
from .kernels.qkv_attention import qkv_attention_kernel
from .kernels.qkv_rope import qkv_rope_kernel
from .kernels.residual_proj import residual_proj_kernel
from .reference import KVCache
from .weights import LlamaWeights


@dataclass(frozen=True)
class DecodePlan:
    """Block sizes, attention split and looped grid of one decode configuration."""

    batch: int
    max_slots: int
    block_b: int
    block_p: int
    block_n: int
    block_k: int
    block_v: int
    block_g: int
    block_s: int
    block_d: int
    block_m: int  # query heads of a KV head's group, padded to a power of two: rows of the split merge
    merge_splits: int  # attention splits the merging program loads per round (block_m · block_d · this = 4096)
    n_splits: int
    split_len: int
    dot_prec: str
    looped_programs: int
    # Weight elements each looped program prefetches per barrier.  Off by default: 16 K made the
    # looped kernel 19% slower on the H200 (plan_sweep, 1B batch 1: 1.46 -> 1.23 ms without).
    prefetch: int = 0
    prefetch_block: int = 1024
    num_warps: int = 4  # 4 at every batch (plan_sweep: 8 warps 13% slower at batch 1, 22% at batch 64)
    split_k: int = 1  # K parts per down-projection tile (summed in order by the last part to finish)
    o_split: int = 1  # K parts per output-projection tile
    num_stages: int | None = None  # software-pipeline depth of the K loops (None: Triton's default)
    # Waits poll with ld.acquire (inline PTX; compiled only) instead of volatile loads and one acquire read:
    # acquire_loads in the looped kernel and the fused Q/K/V + attention launch, looped_acquire_loads in
    # the looped kernel alone.
    acquire_loads: bool = False
    looped_acquire_loads: bool = False
    # Nanoseconds a thread of the looped kernel sleeps between two reads of a count it waits on
    # (fusecore/grid_sync.py; compiled only): fewer polls of the one cache line of the counts
    # while the stage waited for streams its weights.  0: poll back to back.
    poll_sleep_ns: int = 0
    pdl: bool = False  # per-layer kernels: programmatic dependent launch (fusecore/launch_order.py; sm_90+)
    # With pdl, batch-1 row tiles (row_prefetch) issue the weight and norm-weight loads of their first
    # pdl_weights K chunks (0: none, 1 or 2) before the PDL wait, which they make themselves
    # (kernels/matvec.py ``_one_row``): that round trip overlaps the previous kernel's tail.  2 keeps
    # two chunks in flight in the K loop too (registers for a third).  pdl_weights_o: W_o's (0:
    # pdl_weights).  Compiled only; without pdl unused.
    pdl_weights: int = 0
    pdl_weights_o: int = 0
    # K chunk widths of the per-layer Q/K/V, output-projection, gate/up and down-projection launches
    # (0: block_k).  A batch-1 tile keeps two chunks in flight (kernels/matvec.py ``_one_row``); with
    # few tiles per SM (Q/K/V, W_o) the bytes in flight, not HBM, bound the launch, and wider chunks
    # put more in flight.  The looped kernel uses block_k throughout.
    block_k_qkv: int = 0
    block_k_o: int = 0
    block_k_gate_up: int = 0
    block_k_down: int = 0
    # Output features per tile of the per-layer W_o launch (0: block_n).  At batch 1 the fused Q/K/V +
    # attention launch fills every program slot (264 programs, 2 per SM), and W_o's 256 tiles of 8 rows get
    # slots only as those programs exit: 128 tiles of 16 rows fit the 192 slots the Q/K/V tiles free.
    # The looped kernel uses block_n throughout.
    block_n_o: int = 0
    # Dataflow schedule: each of its four done counts (attention, o_proj, gate_up, down) in a 128-byte
    # line of its own, after the line of the Q/K/V group counts, instead of all in one line: a stage's
    # waiting programs poll one line while the other stages' signals go to others.
    spread_counts: bool = False
    # Looped path: the embedding, the looped kernel and the token pick launched with programmatic
    # dependent launch (each scheduled while the one before it still runs, and waiting for it on the GPU)
    # instead of one after another (fusecore/launch_order.py; compiled only).
    looped_pdl: bool = False
    # Warps per program of the per-layer launch of each instruction (0: num_warps).  At batch 8
    # (16-row tensor-core tiles) the Q/K/V tiles are bound by their shared-memory traffic and
    # registers, not HBM (ncu, H200: 13.8% of DRAM bandwidth, 77% of L1, 3 programs per SM), and
    # fewer warps per program ran them faster while the weight-streaming launches ran slower.
    warps_qkv: int = 0
    warps_attention: int = 0
    warps_o: int = 0
    warps_gate_up: int = 0
    warps_down: int = 0
    warps_lm_head: int = 0
    # 128-byte lines of each of its weight rows (64 bf16 columns each; a power of two) a program
    # asks L2 for before it waits: for the previous kernel (per-layer path, with pdl) or for the
    # tiles it depends on (dataflow schedule); fusecore/launch_order.py.  Compiled only.
    wait_prefetch: int = 0
    # Attention tiles ask L2 for the cache slots they read before they wait (for the previous kernel
    # with pdl, for their Q/K/V tiles in the fused launch and the dataflow schedule); compiled only.
    attn_prefetch: bool = False
    # Registers per thread the looped kernel may use (None or 0: as many as the compiler wants).
    # It inlines every instruction, so it needs the most of any of them (up to 255 at batch >= 8).
    # Capped at 128 at batch 1 it ran 1.68 ms per step on the H200 against 2.58 uncapped
    # (plan_sweep, Llama-3.2-1B, 8 warps per program).
    maxnreg: int | None = None
    # Batch 1: each matrix-vector tile loads its next K chunk before it uses the current one and
    # sums across threads once, after its K loop (kernels/matvec.py ``_one_row``); False: the
    # earlier tiles, which sum every chunk across threads as it arrives (two CTA barriers per chunk).
    row_prefetch: bool = True
    # Tensor-core gate/up and LM-head tiles (square_sum_load) and Q/K/V tiles (square_sum_load_qkv),
    # which fold the RMSNorm in: 1 loads each x chunk a second time for the sum of squares, so the
    # load feeding the tensor cores has no other reader and gets a swizzled shared-memory buffer
    # instead of one whose float32 reads conflict 8 ways; 2 issues that load one chunk ahead; 0 one
    # load (kernels/matvec.py ``_square_sums``).
    square_sum_load: int = 0
    square_sum_load_qkv: int = 0
    # K parts per Q/K/V pair block and per gate/up feature block (summed in order by the last
    # part to finish, which runs the epilogue: RoPE and cache append, SiLU · up)
    qkv_split: int = 1
    mlp_split: int = 1
    # Per-layer path: Q/K/V and attention in one launch, attention tiles waiting on per-KV-head
    # counts (kernels/qkv_attention.py): one launch fewer per layer.
    fuse_attention: bool = False
    # Looped path: one launch of one-tile programs ordered by dependency instead of the
    # persistent kernel with grid barriers (kernels/looped.py).
    dataflow: bool = False
    # Per-layer path, batch-1 row tiles with W_o unsplit: W_down's K parts add their sums into ``fix``
    # (int64 multiples of 2^-32: exact, order-free) and end, with no count and no merge; the next
    # layer's Q/K/V tiles read x + fix and its W_o adds fix into x and zeroes it; the last layer's
    # W_down merges as before (kernels/residual_proj.py).
    defer_down: bool = False
    # Per-layer path, batch-1 row tiles, Q/K/V and attention in one launch, W_o unsplit: each attention
    # split is one block of block_s slots (split_len <= block_s), whose tile loads the split's old cache
    # slots before its waits and stores its partial and logsumexp without a count; W_o's tiles merge the
    # (at most MERGE_IN_O_SPLITS) splits as they load their K chunks (kernels/matvec.py merged_chunk),
    # so no attention tile counts, reloads the partials and merges them before the launch can end.
    merge_in_o: bool = False
    # Per-layer path, Q/K/V and attention in one launch: each attention split is one block of block_s slots
    # (split_len <= block_s), whose tile loads the split's old cache slots into registers before its waits
    # (not only into L2) and the step's new slot after them; merge_in_o implies it.
    attn_preload: bool = False

    @property
    def row_sums(self) -> bool:
        """Whether the matrix-vector tiles reduce with row sums in float32 (batch <= SMALL_BATCH
        rows, no padding) rather than tensor-core products on ``block_b`` >= 16 padded rows."""
        return self.block_b <= SMALL_BATCH

    @property
    def roundings_per_layer(self) -> int:
        """Activations a decode layer rounds to the weight dtype: the new K and V cache entries,
        the query and the softmax weights (operands of the attention products) and the MLP
        activation h; with tensor-core tiles also the normalized x before W_qkv and W_gate_up
        and the attention output before W_o."""
        return 5 if self.row_sums else 8

    def launch_options(self) -> dict[str, int]:
        """Keyword arguments of every launch: warps per program and, when set, pipeline stages."""
        return {"num_warps": self.num_warps, **({"num_stages": self.num_stages} if self.num_stages else {})}

    def looped_launch_options(self) -> dict[str, int]:
        """:meth:`launch_options` of the looped kernel, with its register cap when set."""
        return {**self.launch_options(), **({"maxnreg": self.maxnreg} if self.maxnreg else {})}

    def layer_launch_options(self, instruction: str, prefetch_lines: int | None = None) -> dict[str, int | bool]:
        """:meth:`launch_options` of the per-layer kernel of ``instruction`` (its :meth:`warps`), with
        programmatic dependent launch when set; ``prefetch_lines``: the kernel's ``PREFETCH_LINES``
        (lines it asks L2 for before its wait; default :meth:`weight_prefetch_lines`)."""
        if prefetch_lines is None:
            prefetch_lines = self.weight_prefetch_lines()
        return {**self.launch_options(), "num_warps": self.warps(instruction), "USE_PDL": self.pdl,
                "PREFETCH_LINES": prefetch_lines, **({"launch_pdl": True} if self.pdl else {})}

    def row_tiles(self, instruction: str) -> int:
        """``ROW_PREFETCH`` of the per-layer launch of ``instruction`` ("o_proj": :attr:`pdl_weights_o`;
        others :attr:`pdl_weights`): 0 the unpipelined batch-1 tiles, 1 pipelined, 2 or 3 pipelined
        with the first 1 or 2 weight chunks loaded before the tile's own PDL wait; the looped kernel
        takes :attr:`row_prefetch` (it has no PDL wait)."""
        early = (self.pdl_weights_o if instruction == "o_proj" else 0) or self.pdl_weights
        if self.row_prefetch and self.pdl and early and self.block_b == 1:
            return 1 + early
        return int(self.row_prefetch)

    def warps(self, instruction: str) -> int:
        """Warps per program of the per-layer launch of ``instruction`` ("qkv", "attention", "o_proj",
        "gate_up", "down", "lm_head"; others, such as the fused "qkv_attention": num_warps)."""
        override = {"qkv": self.warps_qkv, "attention": self.warps_attention, "o_proj": self.warps_o,
                    "gate_up": self.warps_gate_up, "down": self.warps_down,
                    "lm_head": self.warps_lm_head}.get(instruction, 0)
        return override or self.num_warps

    def k_chunk(self, instruction: str) -> int:
        """BLOCK_K of the per-layer launch of ``instruction`` ("qkv", "o_proj", "gate_up", "down"; others:
        block_k)."""
        override = {"qkv": self.block_k_qkv, "o_proj": self.block_k_o, "gate_up": self.block_k_gate_up,
                    "down": self.block_k_down}.get(instruction, 0)
        return override or self.block_k

    def o_rows(self) -> int:
        """BLOCK_N (output features per tile) of the per-layer W_o launch: :attr:`block_n_o`, else block_n."""
        return self.block_n_o or self.block_n

    def weight_prefetch_lines(self) -> int:
        """``PREFETCH_LINES`` of the per-layer matrix-vector kernels: :attr:`wait_prefetch` with PDL, else 0."""
        return self.wait_prefetch if self.pdl else 0

    def attention_prefetch_lines(self, cfg: LlamaConfig, element_size: int) -> int:
        """``PREFETCH_LINES`` of an attention tile: a split's K (or V) slots, ``split_len · D``
        elements, in 128-byte lines (a power of two), when :attr:`attn_prefetch`; else 0."""
        return next_power_of_2(cdiv(self.split_len * cfg.head_dim * element_size, 128)) if self.attn_prefetch else 0

    def qkv_pair_blocks(self, cfg: LlamaConfig) -> int:
        """Blocks of ``block_p`` RoPE pairs over all Q, K and V heads (the Q/K/V tiles without the K split)."""
        return (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cdiv(cfg.head_dim // 2, self.block_p)

    def tiles(self, cfg: LlamaConfig) -> dict[str, int]:
        """Tiles of each instruction (the grid of its per-layer launch)."""
        return {
            "qkv": self.qkv_pair_blocks(cfg) * self.qkv_split,
            "attention": self.batch * cfg.num_key_value_heads * self.n_splits,
            "o_proj": cdiv(cfg.hidden_size, self.block_n) * self.o_split,
            "gate_up": cdiv(cfg.intermediate_size, self.block_n) * self.mlp_split,
            "down": cdiv(cfg.hidden_size, self.block_n) * self.split_k,
            "lm_head": cdiv(cfg.vocab_size, self.block_v),
        }


MERGE_IN_O_SPLITS = 8  # most attention splits W_o's tiles merge (plan.merge_in_o): every split's partial is loaded


def make_plan(cfg: LlamaConfig, batch: int, max_slots: int, dtype: torch.dtype, device: torch.device,
              n_splits: int | None = None, looped_programs: int | None = None,
              split_k: int | None = None, **tuning: int) -> DecodePlan:
    """Choose block sizes for ``batch`` rows and a cache of ``max_slots`` slots.

    On the GPU tiles are small enough that every instruction has about one tile per
    multiprocessor or more (decode is bandwidth-bound: all SMs must stream weights); under
    the interpreter tiles are large, because each program costs Python time.
    Instructions with fewer tiles than multiprocessors are split along K (``o_split``,
    ``split_k``, ``qkv_split``, ``mlp_split``: the last part of a tile to finish adds the
    parts in order and runs the epilogue).
    ``n_splits`` overrides the number of attention splits and ``split_k`` the number of K
    parts of the down projection (and of W_o at batch > 1) (tests); ``looped_programs`` the
    looped kernel's grid (default: 1 under the interpreter, where programs run one after
    another; on the GPU 0, meaning all co-resident programs, see :func:`looped_decode`).
    ``tuning`` replaces any other field of the plan (``block_b=4`` sends a batch of 2..4
    through row sums instead of tensor-core tiles; the benchmarks' plan sweep), checked for
    consistency.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if max_slots < 1:
        raise ValueError(f"max_slots must be >= 1, got {max_slots}")
    compiled = device.type == "cuda"
    sms = device_facts(device).sm_count if compiled else 1
    # Measured on the H200 (benchmarks plan_sweep, Llama-3.2-1B): one or two rows by row sums
    # (no padding; batch 2: 5% faster than padded tensor-core tiles), more rows by tensor-core
    # tiles of >= 16 rows, the batch padded (batch 8: 2.2x faster than row sums over 8 rows).
    block_b = next_power_of_2(batch) if batch <= 2 else max(16, next_power_of_2(batch))
    if compiled and batch == 1:
        # Narrow tiles of 256-wide k chunks, pipelined (row_prefetch): a warp covers a row's
        # chunk, so the tiles need ~120 registers and fit 4 programs per SM (H200, 16 layers:
        # 0.951 ms per step against 0.961 for the unpipelined 512-wide tiles of the last session).
        # LM-head tiles of 16 rows (session 38, H200, tests/llmfuse/ab_step.py, with acquire-load polls: Llama-3.2-1B
        # 0.7579 / 0.7591 / 0.7599 / 0.7585 / 0.7558 ms against 0.7596 / 0.7605 with 8 rows; 8B 4.135 / 4.137 against
        # 4.147 with 8 rows alone).
        block_k, block_n, block_p, block_v, block_s = 256, 8, 8, 16, 64
    elif compiled and batch == 2:
        block_k, block_n, block_p, block_v, block_s = 1024, 8, 8, 8, 64
    elif compiled:
        # tl.dot needs every dimension >= 16.  64-row weight tiles: each program reads B·K
        # activations from L2 per 64·K weights from HBM (16-row tiles re-read the activations
        # 4x as often: 2.5x slower at batch 64); K split below keeps >= 1 tile per SM.
        block_k, block_n, block_p, block_v, block_s = (128 if block_b <= 16 else 64), 64, 16, 128, 64
        if block_b == 16:
            # Q/K/V tiles of 2 · 32 rows instead of 2 · 16: each program's x chunk meets twice the
            # weight rows (K parts: below).
            block_p = min(32, max(16, next_power_of_2(cfg.head_dim // 2)))
    else:
        block_k = min(128, max(16, next_power_of_2(cfg.hidden_size)))
        block_n, block_v, block_s = 64, 128, 32
        block_p = min(32, max(16, next_power_of_2(cfg.head_dim // 2)))
    block_d = max(16, next_power_of_2(cfg.head_dim))
    block_g = max(16, next_power_of_2(cfg.group_size))
    pairs = batch * cfg.num_key_value_heads
    if tuning.get("merge_in_o") and not tuning.get("block_s"):
        # one block per split, at most MERGE_IN_O_SPLITS of them (W_o loads every split's partial)
        block_s = max(block_s, next_power_of_2(cdiv(max_slots, MERGE_IN_O_SPLITS // 2)))
    if tuning.get("merge_in_o") or tuning.get("attn_preload"):
        block_s = tuning.get("block_s") or block_s
        n_splits = cdiv(max_slots, block_s)
    most_splits = cdiv(max_slots, block_s)
    if n_splits is None:
        # Session 9 (H100, Llama-3.2-1B batch 8, 520 slots): at batches 3..8 with caches up to 1024 slots, one
        # attention tile per SM (3 splits of 192 slots at batch 8) instead of two (5 splits of 128, the last
        # one nearly empty): the looped kernel's programs fit 2 per SM, and 320 attention tiles took more than
        # a wave.  Looped step 1.3141 ms against 1.3468 with 5 splits (same call), per-layer 1.3517 against
        # 1.3491 and 1.3455 against 1.3461 (two calls: equal).  Measured at batch 8 and 520 slots only.
        per_sm = 1 if compiled and 3 <= batch <= 8 and max_slots <= 1024 else 2
        n_splits = max(1, min(cdiv(per_sm * sms, pairs), most_splits, 32))
    n_splits = max(1, min(n_splits, max_slots))
    # whole BLOCK_S blocks per split: no split ends in a half-empty block
    split_len = cdiv(cdiv(max_slots, n_splits), block_s) * block_s
    n_splits = cdiv(max_slots, split_len)
    plan = DecodePlan(
        batch=batch, max_slots=max_slots, block_b=block_b, block_p=block_p, block_n=block_n, block_k=block_k,
        block_v=block_v, block_g=block_g, block_s=block_s, block_d=block_d,
        block_m=next_power_of_2(cfg.group_size),
        merge_splits=max(1, 4096 // (next_power_of_2(cfg.group_size) * block_d)), n_splits=n_splits,
        split_len=split_len, dot_prec="ieee" if dtype == torch.float32 else "tf32",
        looped_programs=1,
    )
    if looped_programs is None:
        looped_programs = 0 if compiled else 1  # 0: as many as are co-resident (decided at launch)
    if split_k is None:
        # A tile streams its K chunks one after another: split K so that no residual-projection
        # tile has more than a few and there are several tiles per SM (1B: W_o 4 -> 1 chunk).
        # Batches of 3..16 (16-row tensor-core tiles): 8 parts (plan_sweep, 1B batch 8: 1.42 -> 1.39 ms).
        shortest_k = min(cfg.num_attention_heads * cfg.head_dim, cfg.intermediate_size)
        most_parts = 8 if block_b == 16 else 4
        split_k = max(1, min(most_parts, shortest_k // block_k)) if compiled else 1
    # Batch 1: W_o's K (2048 for Llama 3.2-1B) is short enough for one part (instruction_breakdown,
    # H200: o_proj 0.076 ms per 16 layers unsplit, 0.123 in 4 parts).
    o_split = 1 if batch == 1 else split_k
    maxnreg = 128 if compiled and batch == 1 else None
    # Tensor-core Q/K/V tiles are 2 · 16 rows: (Hq + 2 Hkv) · D / 32 pair blocks (96 for Llama
    # 3.2-1B), fewer than the SMs, each walking all of K; 4 K parts give ~3 programs per SM.
    # Gate/up tiles are 2 · 64 rows: I / 64 blocks (128 for Llama 3.2-1B); 2 K parts.
    qkv_split, mlp_split = (4, 2) if compiled and not plan.row_sums else (1, 1)
    if compiled and plan.block_b == 16:
        # The 2 · 32-row Q/K/V tiles (block_p above) in K parts of 512 columns (4 chunks): H200
        # plan_sweep, session 5 round 2, batch 8, ms per step, x chunks loaded twice (below):
        # Llama-3.2-1B (4 parts, 192 programs) 1.135 / 1.132 against 1.301 / 1.304 for the 2 · 16-row
        # tiles in 4 parts with one load (the session-5 default); 2 parts 1.194, 8 parts 1.181 /
        # 1.186, 16 parts 1.222; Llama-3.1-8B (8 parts) 5.114 against 6.470.
        qkv_split = max(1, cfg.hidden_size // 512)
    # Measured on the H200 (plan_sweep, Llama-3.2-1B): Q/K/V and attention in one launch at
    # batch 1 (0.935 against 0.942 ms).  The looped path as dependency-ordered one-tile programs up
    # to batch 8 (session 4, every wait with its acquire: batch 8 1.502 ms against 1.568 for the
    # persistent kernel; batch 1 1.248 against 1.83 in session 3), waiting threads sleeping 1 µs
    # between polls at batch 1 (1.224 against 1.306 back to back); batch 64 keeps the persistent
    # kernel (the dependency-ordered schedule is not timed there).  Under the interpreter the
    # persistent kernel stays the default looped path (its tests run one persistent program; tests
    # select the dataflow schedule explicitly).
    # Batch 1 (session 5, H200 plan_sweep): a row tile keeps two K chunks in flight, so a launch with
    # at most two tiles per SM (Llama-3.2-1B: Q/K/V + attention 264 programs, W_o 256, on 132 SMs)
    # is bound by its bytes in flight, not by HBM.  Wider chunks put more in flight and still fit
    # one wave (Q/K/V 512 columns: 215 registers, 2 programs per SM; W_o 1024: 168 registers, 3):
    # 1B 0.9401 -> 0.8942 ms per step.  Llama-3.1-8B (384 Q/K/V and 512 W_o tiles) lost 2.4% with
    # them (4.386 -> 4.491): more tiles than the wider chunks' registers keep resident.
    # Programmatic dependent launch with the attention tiles' cache slots prefetched before their
    # waits: 1B 0.8942 -> 0.8661 with the wider chunks (0.9427 -> 0.9368 without them); Llama-3.1-8B
    # (its chunks unchanged) 4.378 -> 4.327.  Gate/up the other way: 128-column chunks need 63
    # registers, so 8 programs of 4 warps fit an SM and 1B's 1024 gate/up tiles run in one wave
    # instead of two (256 columns: 117 registers, 4 per SM): 1B 0.8676 -> 0.8473 ms.
    # Session 6 (H200 plan_sweep): the row tiles load their first weight chunk before their PDL wait
    # (pdl_weights), so its round trip overlaps the previous kernel's tail (1B 0.8441 -> 0.8001 ms, 8B
    # 4.307 -> 4.241); W_o's tiles their first two (226 registers, still one wave for 1B), measured
    # better in two calls by 0.2-0.5% (1B 0.7995 / 0.7926 against 0.8037 / 0.7939; 8B 4.237 / 4.269
    # against 4.246 / 4.275).  Two chunks for every instruction: 0.9519 (gate/up 80 and W_down 71
    # registers: no longer one wave).  Llama-3.1-8B: gate/up in 128-column chunks although its 1792
    # tiles take two waves at 8 per SM (three and a half at 4 per SM with 256 columns): 4.273 -> 4.195
    # (call 5), 4.263 -> 4.190 (call 6); its 512 W_o tiles in 512-column chunks (4 per SM) 4.220 / 4.214
    # alone but 4.218 with the gate/up chunks: not taken.
    # 16-row tensor-core tiles (batches 3..16) load each x chunk twice, once for the tensor cores
    # and once for the sum of squares (H200, 1B batch 8, ms per 16 layers: gate/up 0.354 against
    # 0.383, LM head 0.131 against 0.151; Q/K/V in 8 K parts 0.211 against 0.191, but the step with
    # 4 parts 1.135 against 1.186 with one load); 64-row tiles (batch 64) once (2.009 against 2.170
    # ms per step).
    # Session 9 (H100, tests/llmfuse/ab_step.py, same call, ms per step, Llama-3.2-1B context 512): the looped
    # path (dependency-ordered tiles, batch <= 8) with its four done counts a 128-byte line apart
    # (spread_counts), acquire-load polls (looped_acquire_loads) and the embedding / looped kernel / token pick
    # chained by programmatic dependent launch (looped_pdl): batch 8 1.3141 / 1.3133 (with the attention
    # splits above) against 1.3891 for HEAD's looped path and 1.3517 for the per-layer launches; without
    # each: spread_counts 1.3348, looped_acquire_loads 1.3350, looped_pdl 1.3145 (call 2: 1.3782 against
    # 1.3838).  Batch 1 1.2781, without the acquire loads 1.3410, without all three 1.3961 (HEAD
    # 1.3948-1.3989 in calls 1-2); per-layer 0.9809.
    # Llama-3.1-8B batch 8: 6.5366 against 6.6752 (call 2) and the per-layer 6.4449.
    # Session 7 (H200 plan_sweep, call 2): W_down's K parts add into the deferred sums and end, without
    # a count or a merge (defer_down), where W_down's tiles fit one wave at 8 programs per SM: then the
    # last part's merge is the launch's tail.  Llama-3.2-1B (1024 tiles): 0.7715 / 0.7711 ms against
    # 0.7778 / 0.7800; Llama-3.1-8B (2048 tiles, two waves) 4.171 / 4.171 against 4.137 / 4.136.
    tiles = plan.tiles(cfg)
    one_row = compiled and batch == 1
    wide_qkv = one_row and tiles["qkv"] + tiles["attention"] <= 2 * sms
    wide_o = one_row and tiles["o_proj"] <= 2 * sms
    plan = DecodePlan(**{**plan.__dict__, "looped_programs": looped_programs, "split_k": split_k, "o_split": o_split,
                         "maxnreg": maxnreg, "qkv_split": qkv_split, "mlp_split": mlp_split,
                         "fuse_attention": one_row,
                         "dataflow": compiled and batch <= 8,
                         "spread_counts": compiled and batch <= 8, "looped_pdl": compiled and batch <= 8,
                         "looped_acquire_loads": compiled and batch <= 8,
                         "poll_sleep_ns": 1024 if one_row else 0,
                         "block_k_qkv": 512 if wide_qkv else 0, "block_k_o": 1024 if wide_o else 0,
                         "block_k_gate_up": 128 if one_row else 0,
                         "pdl": one_row, "attn_prefetch": one_row, "pdl_weights": int(one_row),
                         # session 38 (H200, ab_step, Llama-3.2-1B batch 1, CUDA graph): acquire-load polls in the
                         # fused Q/K/V + attention launch 0.7629 / 0.7596 / 0.7605 ms against 0.7671 / 0.7663 /
                         # 0.7629 / 0.7639 for volatile polls and one acquire read, the 4th call of 4 sessions to find
                         # them faster (29: 0.7668 against 0.7693; 32: 0.7704 against 0.7715)
                         "acquire_loads": one_row,
                         "pdl_weights_o": 2 * one_row, "defer_down": one_row and tiles["down"] * split_k <= 8 * sms,
                         # session 54 (H200, ab_step, batch 1, CUDA graph, interleaved pairs): the attention
                         # tiles' old cache slots loaded before their waits, where the fused launch fits one
                         # wave and its splits are already one block each — Llama-3.2-1B 0.7585 / 0.7594 /
                         # 0.7588 / 0.7598 ms against 0.7636 / 0.7636 / 0.7635 (call 3: 0.7603 / 0.7617 /
                         # 0.7623 against 0.7647 / 0.7653 / 0.7663); Llama-3.1-8B (456 programs: two waves)
                         # 4.335-4.336 against 4.196, so not there
                         "attn_preload": wide_qkv and plan.split_len <= plan.block_s,
                         "square_sum_load": int(plan.block_b == 16),
                         "square_sum_load_qkv": int(plan.block_b == 16)})
    for option in ("acquire_loads", "looped_acquire_loads", "pdl", "looped_pdl", "poll_sleep_ns", "wait_prefetch",
                   "attn_prefetch", "pdl_weights", "pdl_weights_o"):
        if tuning.get(option) and not compiled:
            raise ValueError(f"{option}={tuning[option]!r} needs the compiled kernels on a CUDA device (sm_90+)")
    return _tuned(plan, tuning) if tuning else plan


_BOOL_FIELDS = {f.name: f.type in (bool, "bool") for f in fields(DecodePlan)}


def _tuned(plan: DecodePlan, tuning: dict[str, int]) -> DecodePlan:
    """``plan`` with the fields in ``tuning`` replaced; a TypeError names an unknown field, a
    ValueError a value the kernels cannot run."""
    known = {f.name for f in fields(DecodePlan)} - {"batch", "max_slots"}
    for name, value in tuning.items():
        if name not in known:
            raise TypeError(f"make_plan got an unknown tuning field {name!r}; expected one of {sorted(known)}")
        if name not in ("dot_prec", "maxnreg", "num_stages") and not (isinstance(value, int) and value >= 0):
            raise ValueError(f"tuning field {name} must be an int >= 0, got {value!r}")
        if name in ("maxnreg", "num_stages") and not (value is None or isinstance(value, int) and value >= 0):
            raise ValueError(f"tuning field {name} must be an int >= 0, got {value!r}")
    # switches given as ints (0 / 1, as the plan sweeps pass them) become bools: kernels take some as constexprs
    # that static assertions combine, which need a bool, not an int
    plan = replace(plan, **{name: bool(value) if _BOOL_FIELDS.get(name) else value for name, value in tuning.items()})
    blocks = ("block_p", "block_n", "block_k", "block_v", "block_s")
    # 0: off / block_k / block_n
    optional = ("wait_prefetch", "block_k_qkv", "block_k_o", "block_k_gate_up", "block_k_down", "block_n_o",
                "warps_qkv", "warps_attention", "warps_o", "warps_gate_up", "warps_down", "warps_lm_head")
    if any(getattr(plan, b) & (getattr(plan, b) - 1) or getattr(plan, b) < 1
           for b in ("block_b", "merge_splits", *blocks)) or any(getattr(plan, b) & (getattr(plan, b) - 1)
                                                                 for b in optional):
        raise ValueError(f"block sizes must be powers of two: {plan}")
    if plan.block_b < plan.batch:
        raise ValueError(f"block_b = {plan.block_b} must be >= the batch {plan.batch}")
    chunks = [plan.k_chunk(name) for name in ("qkv", "o_proj", "gate_up", "down")] + [plan.o_rows()]
    if not plan.row_sums and min(plan.block_b, *(getattr(plan, b) for b in blocks), *chunks) < 16:
        raise ValueError(f"tensor-core tiles (block_b = {plan.block_b} > {SMALL_BATCH}) need every block >= 16: "
                         f"{plan}")
    for name in ("pdl_weights", "pdl_weights_o"):  # without pdl there is no wait to load before: unused
        if getattr(plan, name) > 2:
            raise ValueError(f"{name} must be 0, 1 or 2 (K chunks), got {getattr(plan, name)}")
    for name in ("square_sum_load", "square_sum_load_qkv"):
        if getattr(plan, name) not in (0, 1, 2):
            raise ValueError(f"{name} must be 0, 1 or 2, got {getattr(plan, name)}")
    for name in ("split_k", "o_split", "qkv_split", "mlp_split"):
        if getattr(plan, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(plan, name)}")
    if plan.merge_in_o and not (plan.block_b == 1 and plan.row_prefetch and plan.o_split == 1 and plan.fuse_attention
                                and plan.split_len <= plan.block_s and plan.n_splits <= MERGE_IN_O_SPLITS):
        raise ValueError(f"merge_in_o needs batch-1 row tiles (block_b 1, row_prefetch), W_o unsplit (o_split 1), "
                         f"Q/K/V and attention in one launch (fuse_attention) and splits of one block (split_len "
                         f"<= block_s), at most {MERGE_IN_O_SPLITS} of them: {plan}")
    if plan.merge_in_o:
        plan = replace(plan, attn_preload=True)
    if plan.attn_preload and not (plan.fuse_attention and plan.split_len <= plan.block_s) and not (
            tuning.get("attn_preload") or tuning.get("merge_in_o")):
        plan = replace(plan, attn_preload=False)  # the default, where the other tuning fields leave no room for it
    if plan.attn_preload and not (plan.fuse_attention and plan.split_len <= plan.block_s):
        raise ValueError(f"attn_preload needs Q/K/V and attention in one launch (fuse_attention) and splits of "
                         f"one block (split_len <= block_s): {plan}")
    if plan.defer_down and not (plan.block_b == 1 and plan.row_prefetch and plan.o_split == 1):
        if tuning.get("defer_down"):
            raise ValueError(f"defer_down needs batch-1 row tiles (block_b 1, row_prefetch) and W_o unsplit "
                             f"(o_split 1): {plan}")
        plan = replace(plan, defer_down=False)  # the default, where the other tuning fields leave no room for it
    return plan


def rounding_tolerance(cfg: LlamaConfig, plan: DecodePlan, dtype: torch.dtype) -> float:
    """Relative error of a fused step's logits that rounding activations to ``dtype`` explains.

    Each of the plan's ``roundings_per_layer`` roundings per layer changes a value by a relative
    ``δ`` with ``|δ| <= u`` (unit roundoff, ``eps / 2``: 2^-8 in bfloat16).  Independent
    roundings add in quadrature; a layer's branch adds its output to the float32 residual
    stream, so a relative error in the branch reaches the stream at most at its own relative
    size: over ``L`` layers ``sqrt(roundings_per_layer · L) · u``.  Two fused paths that round
    at the same points but may see last-bit different float32 sums (another reduction order)
    round independently, so they differ by at most ``sqrt(2)`` times this.
    """
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"rounding_tolerance is for 16-bit weights, got {dtype}")
    return math.sqrt(plan.roundings_per_layer * cfg.num_hidden_layers) * torch.finfo(dtype).eps / 2


@dataclass
class DecodeBuffers:
    """Static per-step state (see the module docstring); float32 except ``h`` (weight dtype)."""

    x: torch.Tensor  # [B, H] residual stream
    fix: torch.Tensor  # [B, H] int64: deferred down-projection sums in units of 2^-32 (plan.defer_down), else 0
    q: torch.Tensor  # [B, Hq, D] rotated queries
    part: torch.Tensor  # [B, Hq, n_splits, D] normalized attention partials
    lse: torch.Tensor  # [B, Hq, n_splits] their logsumexp
    attn: torch.Tensor  # [B, Hq, D] merged attention
    sem: torch.Tensor  # [B, Hkv] int32: splits finished per group (0 between launches)
    proj_part: torch.Tensor  # [max(split_k, o_split), B, H] float32: K-part sums of the residual projections
    proj_sem: torch.Tensor  # [H tiles] int32: K parts finished per feature tile (0 between launches)
    # K-part sums of the Q/K/V and gate/up instructions (one at a time): Σ x g W [parts, B, rows]
    # and Σ x² [tiles, B] float32, K parts finished per row block (int32, 0 between launches)
    pair_part: torch.Tensor
    pair_sq: torch.Tensor
    pair_sem: torch.Tensor
    h: torch.Tensor  # [B, I] SiLU(gate) * up
    logits: torch.Tensor  # [B, V]
    best: torch.Tensor  # [B, vocab tiles] tile maxima
    best_idx: torch.Tensor  # [B, vocab tiles] int32 tile argmaxes
    slot: torch.Tensor  # 0-d int64: the cache slot the next token is written to
    kv_start: torch.Tensor  # [B] int64: first valid slot of each row (left padding)
    seed: torch.Tensor  # 0-d int64: Philox key of fused sampling
    inv_temperature: torch.Tensor  # 0-d float32: 1 / temperature of fused sampling
    # int32: grid barrier count; per-KV-head Q/K/V tile counts; dataflow's done counts (4), after them
    # (plan.spread_counts: from the next 128-byte line on, one line each); room for both layouts
    counter: torch.Tensor  # [ceil((1 + Hkv) / 32) · 32 + 4 · 32] int32
    timeout: torch.Tensor  # [2] int32: a wait gave up (looped kernel, fused Q/K/V + attention); prefetch sink

    @classmethod
    def allocate(cls, cfg: LlamaConfig, plan: DecodePlan, dtype: torch.dtype, device: torch.device) -> DecodeBuffers:
        B, f32 = plan.batch, torch.float32
        hq, d = cfg.num_attention_heads, cfg.head_dim
        tiles = plan.tiles(cfg)
        vt = tiles["lm_head"]
        # the split partials and their logsumexps in one allocation, the logsumexps last: W_o's tiles find
        # them after the partials (plan.merge_in_o, kernels/matvec.py rows_dot)
        n_part = B * hq * plan.n_splits * d
        part_lse = torch.zeros(n_part + B * hq * plan.n_splits, dtype=f32, device=device)
        return cls(
            x=torch.zeros(B, cfg.hidden_size, dtype=f32, device=device),
            fix=torch.zeros(B, cfg.hidden_size, dtype=torch.int64, device=device),
            q=torch.zeros(B, hq, d, dtype=f32, device=device),
            part=part_lse[:n_part].view(B, hq, plan.n_splits, d),
            lse=part_lse[n_part:].view(B, hq, plan.n_splits),
            attn=torch.zeros(B, hq, d, dtype=f32, device=device),
            sem=torch.zeros(B, cfg.num_key_value_heads, dtype=torch.int32, device=device),
            proj_part=torch.zeros(max(plan.split_k, plan.o_split), B, cfg.hidden_size, dtype=f32, device=device),
            proj_sem=torch.zeros(cdiv(cfg.hidden_size, min(plan.block_n, plan.o_rows())), dtype=torch.int32,
                                 device=device),
            pair_part=torch.zeros(max(plan.qkv_split * cfg.qkv_rows, plan.mlp_split * 2 * cfg.intermediate_size) * B,
                                  dtype=f32, device=device),
            pair_sq=torch.zeros(max(tiles["qkv"], tiles["gate_up"]) * B, dtype=f32, device=device),
            pair_sem=torch.zeros(max(tiles["qkv"] // plan.qkv_split, tiles["gate_up"] // plan.mlp_split),
                                 dtype=torch.int32, device=device),
            h=torch.zeros(B, cfg.intermediate_size, dtype=dtype, device=device),
            logits=torch.zeros(B, cfg.vocab_size, dtype=f32, device=device),
            best=torch.zeros(B, vt, dtype=f32, device=device),
            best_idx=torch.zeros(B, vt, dtype=torch.int32, device=device),
            slot=torch.zeros((), dtype=torch.int64, device=device),
            kv_start=torch.zeros(B, dtype=torch.int64, device=device),
            seed=torch.zeros((), dtype=torch.int64, device=device),
            inv_temperature=torch.ones((), dtype=f32, device=device),
            counter=torch.zeros(cdiv(1 + cfg.num_key_value_heads, COUNT_LINE) * COUNT_LINE + DONE_COUNTS * COUNT_LINE,
                                dtype=torch.int32, device=device),
            timeout=torch.zeros(2, dtype=torch.int32, device=device),
        )


def check_step_inputs(w: LlamaWeights, cache: KVCache, buf: DecodeBuffers, plan: DecodePlan) -> None:
    """Device and shape checks shared by the launchers (cheap; no device sync)."""
    backend.check_devices(wqkv=w.wqkv, k_cache=cache.k, v_cache=cache.v, x=buf.x)
    if cache.batch != plan.batch or buf.x.shape[0] != plan.batch:
        raise ValueError(f"cache batch {cache.batch} and buffers batch {buf.x.shape[0]} must equal plan batch "
                         f"{plan.batch}")
    if cache.max_slots != plan.max_slots:
        raise ValueError(f"cache has {cache.max_slots} slots but the plan was made for {plan.max_slots}")


def embed(w: LlamaWeights, tokens: torch.Tensor, buf: DecodeBuffers, pdl: bool = False) -> None:
    """x ← embedding rows of ``tokens`` [B] (float32), the deferred sums ``buf.fix`` and the step's
    dependency counts (``buf.counter``) zeroed, in one launch (kernels/embed.py); ``pdl``: the next launch may start
    before this one ends (it must wait for it: a per-layer launch with programmatic dependent launch)."""
    H = w.embed.shape[1]
    embed_kernel[(tokens.shape[0],)](
        tokens, w.embed, buf.x, buf.fix, buf.counter, H, buf.counter.numel(),
        BLOCK_H=min(4096, next_power_of_2(H)), BLOCK_C=next_power_of_2(buf.counter.numel()), USE_PDL=pdl,
    )


def qkv_rope(w: LlamaWeights, cfg: LlamaConfig, layer: int, cache: KVCache, buf: DecodeBuffers, plan: DecodePlan,
             inv_freq: torch.Tensor) -> None:
    grid = (plan.tiles(cfg)["qkv"],)
    qkv_rope_kernel[grid](
        layer, buf.x, buf.fix, w.attn_norm, w.wqkv, w.bqkv if w.bqkv is not None else w.wqkv, inv_freq, buf.kv_start,
        buf.slot, buf.q, cache.k, cache.v, buf.pair_part, buf.pair_sq, buf.pair_sem,
        plan.batch, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
        plan.max_slots, cfg.rms_norm_eps,
        HAS_BIAS=w.bqkv is not None, BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_K=plan.k_chunk("qkv"),
        DOT_PREC=plan.dot_prec, ROW_PREFETCH=plan.row_tiles("qkv"), QKV_SPLIT=plan.qkv_split,
        SQ_LOAD=plan.square_sum_load_qkv, X_FIX=plan.defer_down,
        **plan.layer_launch_options("qkv"),
    )


def decode_attention(cfg: LlamaConfig, layer: int, cache: KVCache, buf: DecodeBuffers, plan: DecodePlan) -> None:
    grid = (plan.tiles(cfg)["attention"],)
    decode_attention_kernel[grid](
        layer, buf.q, cache.k, cache.v, buf.kv_start, buf.slot, buf.part, buf.lse, buf.attn, buf.sem,
        plan.batch, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, plan.max_slots,
        plan.n_splits, plan.split_len, 1.0 / math.sqrt(cfg.head_dim),
        BLOCK_G=plan.block_g, BLOCK_S=plan.block_s, BLOCK_D=plan.block_d, BLOCK_M=plan.block_m,
        MERGE_SPLITS=plan.merge_splits,
        DOT_PREC=plan.dot_prec, **plan.layer_launch_options(
            "attention", plan.attention_prefetch_lines(cfg, cache.k.element_size())),
    )


def qkv_attention(w: LlamaWeights, cfg: LlamaConfig, layer: int, cache: KVCache, buf: DecodeBuffers,
                  plan: DecodePlan, inv_freq: torch.Tensor) -> None:
    """Instructions 1 and 2 in one launch (``plan.fuse_attention``).  The per-KV-head counts in
    ``buf.counter[1:]`` accumulate over the layers of a step: zero them before layer 0."""
    tiles = plan.tiles(cfg)
    qkv_attention_kernel[(tiles["qkv"] + tiles["attention"],)](
        layer, buf.x, buf.fix, w.attn_norm, w.wqkv, w.bqkv if w.bqkv is not None else w.wqkv, inv_freq, buf.kv_start,
        buf.slot, buf.q, cache.k, cache.v, buf.pair_part, buf.pair_sq, buf.pair_sem,
        buf.part, buf.lse, buf.attn, buf.sem, buf.counter[1:], buf.timeout,
        plan.batch, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
        plan.max_slots, cfg.rms_norm_eps, plan.n_splits, plan.split_len, 1.0 / math.sqrt(cfg.head_dim),
        BARRIER_MAX_POLLS,
        HAS_BIAS=w.bqkv is not None, BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_K=plan.k_chunk("qkv"),
        BLOCK_G=plan.block_g, BLOCK_S=plan.block_s, BLOCK_D=plan.block_d, BLOCK_M=plan.block_m,
        MERGE_SPLITS=plan.merge_splits,
        DOT_PREC=plan.dot_prec, ROW_PREFETCH=plan.row_tiles("qkv"), QKV_SPLIT=plan.qkv_split,
        SQ_LOAD=plan.square_sum_load_qkv,
        ACQUIRE_LOADS=plan.acquire_loads,
        ATTN_PREFETCH_LINES=plan.attention_prefetch_lines(cfg, cache.k.element_size()), X_FIX=plan.defer_down,
        ATTN_PRELOAD=plan.attn_preload, MERGE_IN_O=plan.merge_in_o, **plan.layer_launch_options("qkv_attention"),
    )


def o_proj(w: LlamaWeights, cfg: LlamaConfig, layer: int, buf: DecodeBuffers, plan: DecodePlan) -> None:
    """x += attn W_oᵀ (instruction 3); with ``plan.defer_down`` also x += the deferred sums, which are zeroed;
    with ``plan.merge_in_o`` attn is merged from the attention splits' partials ``buf.part`` / ``buf.lse``."""
    residual_proj_kernel[(cdiv(cfg.hidden_size, plan.o_rows()) * plan.o_split,)](
        layer, buf.part if plan.merge_in_o else buf.attn, w.wo, buf.x, buf.fix, buf.proj_part, buf.proj_sem,
        plan.batch, cfg.hidden_size,
        cfg.num_attention_heads * cfg.head_dim,
        plan.o_split, BLOCK_B=plan.block_b, BLOCK_N=plan.o_rows(), BLOCK_K=plan.k_chunk("o_proj"),
        DOT_PREC=plan.dot_prec, ROW_PREFETCH=plan.row_tiles("o_proj"), X_FIX=2 * plan.defer_down,
        MERGE_NS=plan.n_splits if plan.merge_in_o else 0, MERGE_D=cfg.head_dim,
        **plan.layer_launch_options("o_proj"),
    )


def gate_up(w: LlamaWeights, cfg: LlamaConfig, layer: int, buf: DecodeBuffers, plan: DecodePlan) -> None:
    grid = (plan.tiles(cfg)["gate_up"],)
    gate_up_kernel[grid](
        layer, buf.x, w.mlp_norm, w.w_gate_up, buf.h, buf.pair_part, buf.pair_sq, buf.pair_sem, plan.batch,
        cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps,
        BLOCK_B=plan.block_b, BLOCK_N=plan.block_n, BLOCK_K=plan.k_chunk("gate_up"),
        DOT_PREC=plan.dot_prec, ROW_PREFETCH=plan.row_tiles("gate_up"), SQ_LOAD=plan.square_sum_load,
        MLP_SPLIT=plan.mlp_split,
        **plan.layer_launch_options("gate_up"),
    )


def down_proj(w: LlamaWeights, cfg: LlamaConfig, layer: int, buf: DecodeBuffers, plan: DecodePlan) -> None:
    """x += h W_downᵀ (instruction 5); with ``plan.defer_down`` (bar the last layer) into the deferred sums."""
    residual_proj_kernel[(plan.tiles(cfg)["down"],)](
        layer, buf.h, w.w_down, buf.x, buf.fix, buf.proj_part, buf.proj_sem, plan.batch, cfg.hidden_size,
        cfg.intermediate_size, plan.split_k,
        BLOCK_B=plan.block_b, BLOCK_N=plan.block_n, BLOCK_K=plan.k_chunk("down"),
        DOT_PREC=plan.dot_prec, ROW_PREFETCH=plan.row_tiles("down"),
        X_FIX=int(plan.defer_down and layer < cfg.num_hidden_layers - 1), **plan.layer_launch_options("down"),
    )


def lm_head(w: LlamaWeights, cfg: LlamaConfig, buf: DecodeBuffers, plan: DecodePlan, write_logits: bool,
            sample: bool = False) -> None:
    """Tile winners of the logits (greedy) or of logits / T + Gumbel noise (``sample``; seed and
    1/T from ``buf.seed`` and ``buf.inv_temperature``); the logits themselves when ``write_logits``."""
    tiles = plan.tiles(cfg)["lm_head"]
    lm_head_kernel[(tiles,)](
        buf.x, w.final_norm, w.lm_head, buf.logits, buf.best, buf.best_idx, buf.seed, buf.inv_temperature, buf.slot,
        plan.batch, cfg.hidden_size, cfg.vocab_size, tiles, cfg.rms_norm_eps,
        WRITE_LOGITS=write_logits, SAMPLE=sample, BLOCK_B=plan.block_b, BLOCK_N=plan.block_v, BLOCK_K=plan.block_k,
        DOT_PREC=plan.dot_prec, ROW_PREFETCH=plan.row_tiles("lm_head"), SQ_LOAD=plan.square_sum_load,
        **plan.layer_launch_options("lm_head"),
    )


def greedy_tokens(buf: DecodeBuffers, pdl: bool = False) -> torch.Tensor:
    """[B] int64 tokens (a new tensor) from the LM head's tile winners: the argmax of the logits (first
    index on ties), or the sampled token after a ``sample`` step; one launch (kernels/lm_head.py
    ``pick_kernel``; ``pdl``: launched with programmatic dependent launch after the LM head)."""
    B, n_tiles = buf.best.shape
    tokens = torch.empty(B, dtype=torch.int64, device=buf.best.device)
    block = next_power_of_2(n_tiles)
    pick_kernel[(B,)](buf.best, buf.best_idx, tokens, n_tiles, BLOCK_T=block, USE_PDL=pdl,
                      num_warps=max(4, min(16, block // 1024)), **({"launch_pdl": True} if pdl else {}))
    return tokens


def decode_layers(w: LlamaWeights, cfg: LlamaConfig, cache: KVCache, buf: DecodeBuffers, plan: DecodePlan,
                  inv_freq: torch.Tensor) -> None:
    """The per-layer path: five fused launches per layer on the embedded ``buf.x`` (four with
    ``plan.fuse_attention``, whose counts :func:`embed` zeroed)."""
    for layer in range(cfg.num_hidden_layers):
        if plan.fuse_attention:
            qkv_attention(w, cfg, layer, cache, buf, plan, inv_freq)
        else:
            qkv_rope(w, cfg, layer, cache, buf, plan, inv_freq)
            decode_attention(cfg, layer, cache, buf, plan)
        o_proj(w, cfg, layer, buf, plan)
        gate_up(w, cfg, layer, buf, plan)
        down_proj(w, cfg, layer, buf, plan)


MAX_PROGRAMS_PER_SM = 4
# A barrier wait takes microseconds; after this many reads of its counter (seconds) the
# looped kernel gives up and raises its timeout flag (see looped_timed_out).
BARRIER_MAX_POLLS = 1 << 22


def resident_programs_per_sm(kernel, device: torch.device) -> int:
    """How many programs of a compiled kernel one SM holds at once (registers, shared memory, threads).

    Conservative: registers are rounded up to the allocation granularity (8 per thread) and
    1 KB of shared memory per program is reserved for the driver.  1 if unknown.
    """
    init = getattr(kernel, "_init_handles", None)
    if init is not None:
        init()
    n_regs = getattr(kernel, "n_regs", None)
    if not n_regs:
        return 1
    props = torch.cuda.get_device_properties(device)
    threads = 32 * kernel.metadata.num_warps
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    threads_per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    by_regs = regs_per_sm // (-(-n_regs // 8) * 8 * threads)
    by_smem = smem_per_sm // (kernel.metadata.shared + 1024)
    return max(1, min(by_regs, by_smem, threads_per_sm // threads))


_LOOPED_GRIDS = PlanCache(maxsize=64)


def looped_decode(w: LlamaWeights, cfg: LlamaConfig, cache: KVCache, buf: DecodeBuffers, plan: DecodePlan,
                  inv_freq: torch.Tensor, write_logits: bool, stop_stage: int | None = None,
                  sample: bool = False, zero_counts: bool = True) -> int:
    """The looped path: all layers and the LM head in one launch; returns its grid.

    With ``plan.dataflow`` one program per tile of every stage, ordered by dependency.
    Otherwise the persistent kernel: the grid is ``plan.looped_programs`` when set, else (on
    the GPU) as many programs as are co-resident — up to ``MAX_PROGRAMS_PER_SM`` per SM, from the compiled kernel's
    registers and shared memory — and no more than the largest stage has tiles: the grid
    barriers need every program resident at once.  ``stop_stage`` (tests) stops after that
    many stages of the schedule in :mod:`llmfuse.kernels.looped` (default: all ``5 L + 1``).
    ``zero_counts=False``: the counts are zero already (:func:`embed` zeroed them just before, in
    :func:`fused_step`), so no memset (a graph node of its own) precedes the launch.
    """
    total = STAGES_PER_LAYER * cfg.num_hidden_layers + 1
    stop = total if stop_stage is None else stop_stage
    if not 0 <= stop <= total:
        raise ValueError(f"stop_stage must be in [0, {total}], got {stop_stage}")
    tiles = plan.tiles(cfg)
    args = (
        buf.x, w.attn_norm, w.wqkv, w.bqkv if w.bqkv is not None else w.wqkv, inv_freq, buf.kv_start, buf.slot,
        buf.q, cache.k, cache.v, buf.pair_part, buf.pair_sq, buf.pair_sem, buf.part, buf.lse, buf.attn, buf.sem,
        buf.proj_part, buf.proj_sem, w.wo,
        w.mlp_norm, w.w_gate_up, buf.h, w.w_down,
        w.final_norm, w.lm_head, buf.logits, buf.best, buf.best_idx, buf.seed, buf.inv_temperature, buf.counter,
        buf.timeout,
        cfg.num_hidden_layers, plan.batch, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
        cfg.head_dim, plan.max_slots, cfg.intermediate_size, cfg.vocab_size, cfg.rms_norm_eps,
        plan.n_splits, plan.split_len, 1.0 / math.sqrt(cfg.head_dim), tiles["lm_head"], stop, BARRIER_MAX_POLLS,
        plan.o_split, plan.split_k, cfg.num_attention_heads * cfg.head_dim,
    )
    constexprs = dict(
        HAS_BIAS=w.bqkv is not None, WRITE_LOGITS=write_logits, SAMPLE=sample, BLOCK_B=plan.block_b,
        BLOCK_P=plan.block_p,
        BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, BLOCK_G=plan.block_g, BLOCK_S=plan.block_s, BLOCK_M=plan.block_m,
        MERGE_SPLITS=plan.merge_splits,
        BLOCK_D=plan.block_d, BLOCK_V=plan.block_v, DOT_PREC=plan.dot_prec, ROW_PREFETCH=plan.row_prefetch,
        SQ_LOAD=plan.square_sum_load, SQ_LOAD_QKV=plan.square_sum_load_qkv,
        QKV_SPLIT=plan.qkv_split, MLP_SPLIT=plan.mlp_split,
        ACQUIRE_LOADS=plan.acquire_loads or plan.looped_acquire_loads,
        POLL_SLEEP=plan.poll_sleep_ns, PREFETCH=plan.prefetch, PREFETCH_BLOCK=plan.prefetch_block,
        DATAFLOW=plan.dataflow, WAIT_PREFETCH=plan.wait_prefetch if plan.dataflow else 0,
        ATTN_PREFETCH=plan.attention_prefetch_lines(cfg, cache.k.element_size()) if plan.dataflow else 0,
        DONE_STRIDE=COUNT_LINE if plan.spread_counts else 1, USE_PDL=plan.looped_pdl,
    )
    pdl = {"launch_pdl": True} if plan.looped_pdl else {}
    if zero_counts:
        buf.counter.zero_()  # the timeout flag stays raised until the buffers are remade
    if plan.dataflow:  # one program per tile; each keeps its own tile's registers: no cap
        grid = cfg.num_hidden_layers * sum(n for name, n in tiles.items() if name != "lm_head") + tiles["lm_head"]
        looped_decode_kernel[(grid,)](*args, **constexprs, **plan.launch_options(), **pdl)
        return grid
    constexprs.update(plan.looped_launch_options())
    programs = plan.looped_programs
    if programs == 0:
        device = buf.x.device

        def occupancy_grid() -> int:
            compiled = looped_decode_kernel.warmup(*args, grid=(1,), **constexprs)
            per_sm = min(MAX_PROGRAMS_PER_SM, resident_programs_per_sm(compiled, device))
            return persistent_grid(max(tiles.values()), device, programs_per_sm=per_sm)

        key = (tuple(constexprs.items()), str(w.dtype), str(device), max(tiles.values()))
        programs = _LOOPED_GRIDS.get(key, occupancy_grid)
    looped_decode_kernel[(programs,)](*args, **constexprs, **pdl)
    return programs


def looped_timed_out(buf: DecodeBuffers) -> bool:
    """Whether a looped launch since the buffers were made gave up waiting at a grid barrier
    (a grid that was not co-resident; its outputs are then wrong).  Synchronizes with the device."""
    return bool(buf.timeout[0].item())


def fused_step(w: LlamaWeights, cfg: LlamaConfig, cache: KVCache, buf: DecodeBuffers, plan: DecodePlan,
               inv_freq: torch.Tensor, tokens: torch.Tensor, *, looped: bool, write_logits: bool,
               sample: bool = False) -> torch.Tensor:
    """One decode step at slot ``buf.slot`` (not advanced); returns the next tokens [B]:
    greedy, or sampled with the Gumbel-max trick when ``sample``.

    Host-sync free and shape-static: capturable in a CUDA graph.
    """
    check_step_inputs(w, cache, buf, plan)
    if tokens.shape != (plan.batch,) or tokens.dtype != torch.int64 or tokens.device != buf.x.device:
        raise ValueError(f"tokens must be an int64 tensor of shape ({plan.batch},) on {buf.x.device}, got "
                         f"{tokens.dtype} {tuple(tokens.shape)} on {tokens.device}")
    embed(w, tokens, buf, pdl=plan.looped_pdl if looped else plan.pdl)
    if looped:
        looped_decode(w, cfg, cache, buf, plan, inv_freq, write_logits, sample=sample, zero_counts=False)
    else:
        decode_layers(w, cfg, cache, buf, plan, inv_freq)
        lm_head(w, cfg, buf, plan, write_logits, sample=sample)
    return greedy_tokens(buf, pdl=plan.looped_pdl if looped else plan.pdl)
