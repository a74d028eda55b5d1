"""A plain-Python interpreter of the looped decode kernel's schedule.

:func:`interpret_schedule` executes the stages of :mod:`llmfuse.kernels.looped` in order —
``5 · layer + k`` for k = qkv, attention, o_proj, gate_up, down, then the LM head at
``5 L`` — with PyTorch ops, on the same :class:`~llmfuse.ops.DecodeBuffers` and cache the
kernel uses, and can stop after any stage.  The math of each stage comes from
:mod:`llmfuse.reference`; the attention stage reproduces the kernel's sequence splits
(normalized partial outputs and their logsumexp, −inf for empty splits) and merges them
with :func:`fusecore.softmax.merge_partials` into ``attn``, which the o_proj stage reads.  Tests run kernel and
interpreter to the same stop stage and compare every buffer.
"""

from __future__ import annotations

import math

import torch

from fusecore.softmax import merge_partials

from . import reference as ref
from .config import LlamaConfig
from .kernels.looped import STAGES_PER_LAYER
from .ops import DecodeBuffers, DecodePlan
from .weights import LlamaWeights

STAGE_NAMES = ("qkv_rope", "attention", "o_proj", "gate_up", "down_proj")


def stage_name(stage: int, num_layers: int) -> str:
    """Human name of global stage ``stage``: 'layer 3 o_proj' or 'lm_head'."""
    if stage == STAGES_PER_LAYER * num_layers:
        return "lm_head"
    return f"layer {stage // STAGES_PER_LAYER} {STAGE_NAMES[stage % STAGES_PER_LAYER]}"


def _attention_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_start: torch.Tensor, slot: int,
                        plan: DecodePlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split normalized outputs [B, Hq, splits, D] and logsumexp [B, Hq, splits] (float32)."""
    B, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    kk = k.float().repeat_interleave(group, dim=1)  # [B, Hq, S, D]
    vv = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("bhd,bhsd->bhs", q.float(), kk) / math.sqrt(d)
    slots = torch.arange(k.shape[2], device=q.device)
    part = torch.zeros(B, hq, plan.n_splits, d, dtype=torch.float32, device=q.device)
    lse = torch.full((B, hq, plan.n_splits), float("-inf"), dtype=torch.float32, device=q.device)
    for s in range(plan.n_splits):
        lo, hi = s * plan.split_len, min((s + 1) * plan.split_len, slot + 1)
        valid = (slots >= lo) & (slots < hi) & (slots[None, :] >= kv_start[:, None])  # [B, S]
        masked = scores.masked_fill(~valid[:, None, :], float("-inf"))
        split_lse = torch.logsumexp(masked, dim=-1)
        weights = torch.exp(masked - torch.where(torch.isfinite(split_lse), split_lse, 0.0)[..., None])
        part[:, :, s] = torch.einsum("bhs,bhsd->bhd", weights, vv)
        lse[:, :, s] = split_lse
    return part, lse


def interpret_schedule(w: LlamaWeights, cfg: LlamaConfig, cache: ref.KVCache, buf: DecodeBuffers, plan: DecodePlan,
                       inv_freq: torch.Tensor, stop_stage: int | None = None, write_logits: bool = True) -> None:
    """Run stages ``0 .. stop_stage − 1`` of the looped schedule on ``buf`` and ``cache`` in place."""
    total = STAGES_PER_LAYER * cfg.num_hidden_layers + 1
    stop = total if stop_stage is None else stop_stage
    slot = int(buf.slot)
    kv_start = buf.kv_start
    B = plan.batch
    positions = (slot - kv_start)[:, None]
    for stage in range(stop):
        layer, k = divmod(stage, STAGES_PER_LAYER)
        if stage == total - 1:
            logits = ref.lm_head_step(w, cfg, buf.x.to(w.dtype)).float()
            if write_logits:
                buf.logits.copy_(logits)
            tiles = buf.best.shape[1]
            padded = torch.full((B, tiles * plan.block_v), float("-inf"), device=logits.device)
            padded[:, : cfg.vocab_size] = logits
            best, idx = padded.view(B, tiles, plan.block_v).max(dim=2)
            buf.best.copy_(best)
            buf.best_idx.copy_(idx.to(torch.int32) + torch.arange(tiles, device=idx.device, dtype=torch.int32)
                               * plan.block_v)
        elif k == 0:
            q, kk, vv = ref.qkv_step(w, cfg, layer, buf.x[:, None].to(w.dtype), positions, inv_freq)
            buf.q.copy_(q[:, 0])
            cache.k[layer, :, :, slot] = kk[:, 0].to(cache.k.dtype)
            cache.v[layer, :, :, slot] = vv[:, 0].to(cache.v.dtype)
        elif k == 1:
            part, lse = _attention_partials(buf.q, cache.k[layer], cache.v[layer], kv_start, slot, plan)
            buf.part.copy_(part)
            buf.lse.copy_(lse)
            buf.attn.copy_(merge_partials(part, lse, dim=2)[0])
        elif k == 2:
            attn = buf.attn.reshape(B, -1).to(w.dtype)
            buf.x.copy_(ref.o_proj_step(w, layer, attn, buf.x.to(w.dtype)).float())
        elif k == 3:
            buf.h.copy_(ref.mlp_step(w, cfg, layer, buf.x.to(w.dtype)).to(buf.h.dtype))
        else:
            buf.x.copy_(ref.down_step(w, layer, buf.h.to(w.dtype), buf.x.to(w.dtype)).float())
