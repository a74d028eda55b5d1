"""The unfused PyTorch Llama decoder with a static KV cache (gpt-fast style).

Baseline in benchmarks, oracle in tests, and the prefill path of the engine: it fills the
same cache the fused decode kernels read.  Every step of a decoder layer is its own
function, so the tests can check each fused kernel against exactly the math it replaces:

    x_n   = RMSNorm(x) = x / sqrt(mean(x²) + eps) * g                    (rms_norm)
    q,k,v = x_n W_qkvᵀ (+ b),  RoPE on q and k at each row's position    (qkv_step)
    cache[slot] = k, v                                                   (forward)
    a     = softmax(q kᵀ / sqrt(D) over valid slots) v, GQA              (attention_step)
    x    += a W_oᵀ                                                       (o_proj_step)
    h     = SiLU(RMSNorm(x) W_gateᵀ) · (RMSNorm(x) W_upᵀ)                (mlp_step)
    x    += h W_downᵀ                                                    (down_step)
    logits = RMSNorm(x) W_headᵀ                                          (lm_head_step)

RoPE pairs element ``j`` with ``j + D/2`` of each head (transformers' ``rotate_half``) at
angle ``position · inv_freq_j``.  Slots are cache positions shared by the batch; a row
left-padded by ``p`` tokens has its valid keys in slots ``[p, ...)`` and its RoPE position
is ``slot − p``.  All arithmetic runs in the dtype of the weights given (pass float64
weights for an oracle).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fusecore.rng import philox_reference

from .config import LlamaConfig
from .weights import LlamaWeights


@dataclass
class KVCache:
    """Static KV cache: ``k``, ``v`` of shape [L, B, Hkv, S, D]; ``S`` slots fixed at creation."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def empty(cls, config: LlamaConfig, batch: int, max_slots: int, *, dtype: torch.dtype,
              device: torch.device | str) -> KVCache:
        shape = (config.num_hidden_layers, batch, config.num_key_value_heads, max_slots, config.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_slots(self) -> int:
        return self.k.shape[3]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x², -1) + eps) * weight, computed in x's dtype."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (j, j + D/2) of x [B, T, heads, D] by angle positions[b, t] · inv_freq[j]."""
    angle = positions.to(torch.float32)[..., None] * inv_freq.to(device=x.device, dtype=torch.float32)
    cos = torch.cos(angle).to(x.dtype)[:, :, None, :]
    sin = torch.sin(angle).to(x.dtype)[:, :, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def qkv_step(w: LlamaWeights, cfg: LlamaConfig, layer: int, x: torch.Tensor, positions: torch.Tensor,
             inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm + Q/K/V projection + RoPE: x [B, T, H] -> q [B, T, Hq, D], k, v [B, T, Hkv, D]."""
    B, T, _ = x.shape
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qkv = rms_norm(x, w.attn_norm[layer], cfg.rms_norm_eps) @ w.wqkv[layer].to(x.dtype).T
    if w.bqkv is not None:
        qkv = qkv + w.bqkv[layer].to(x.dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q = apply_rope(q.reshape(B, T, hq, d), positions, inv_freq)
    k = apply_rope(k.reshape(B, T, hkv, d), positions, inv_freq)
    return q, k, v.reshape(B, T, hkv, d)


def attention_step(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_slots: torch.Tensor,
                   kv_start: torch.Tensor) -> torch.Tensor:
    """Attention of q [B, T, Hq, D] over one layer's cache [B, Hkv, S, D] -> [B, T, Hq D].

    Query ``t`` of row ``b`` (at slot ``query_slots[t]``) sees slots ``kv_start[b] .. query_slots[t]``;
    a padding query (slot < kv_start) sees only its own slot.
    """
    B, T, hq, d = q.shape
    hkv, S = k_cache.shape[1], k_cache.shape[2]
    slots = torch.arange(S, device=q.device)
    qs = query_slots.to(q.device)[:, None]
    start = kv_start.to(q.device)[:, None, None]
    mask = (slots[None, None, :] <= qs[None]) & ((slots[None, None, :] >= start) | (slots[None, None, :] == qs[None]))
    group = hq // hkv
    k = k_cache.to(q.dtype).repeat_interleave(group, dim=1)
    v = v_cache.to(q.dtype).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None])
    return out.transpose(1, 2).reshape(B, T, hq * d)


def o_proj_step(w: LlamaWeights, layer: int, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Residual after attention: x + attn W_oᵀ."""
    return x + attn @ w.wo[layer].to(x.dtype).T


def mlp_step(w: LlamaWeights, cfg: LlamaConfig, layer: int, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU input: h = SiLU(x_n W_gateᵀ) · (x_n W_upᵀ), x_n = RMSNorm(x); [.., I]."""
    xn = rms_norm(x, w.mlp_norm[layer], cfg.rms_norm_eps)
    gate, up = (xn @ w.w_gate_up[layer].to(x.dtype).T).split(cfg.intermediate_size, dim=-1)
    return F.silu(gate) * up


def down_step(w: LlamaWeights, layer: int, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Residual after the MLP: x + h W_downᵀ."""
    return x + h @ w.w_down[layer].to(x.dtype).T


def lm_head_step(w: LlamaWeights, cfg: LlamaConfig, x: torch.Tensor) -> torch.Tensor:
    """Logits: RMSNorm(x) W_headᵀ, in x's dtype."""
    return rms_norm(x, w.final_norm, cfg.rms_norm_eps) @ w.lm_head.to(x.dtype).T


def gumbel_sample(logits: torch.Tensor, temperature: float, seed: int, position: int) -> torch.Tensor:
    """Draw one token per row of logits [B, V] from softmax(logits / T) by the Gumbel-max trick.

    ``argmax_v logits / T − log(−log u_v)`` with ``u`` the open uniform of Philox word 0 at
    key ``seed``, stream ``b·V + v``, ``position`` — the noise the fused LM head draws.
    """
    B, V = logits.shape
    stream = np.arange(B * V, dtype=np.int64).reshape(B, V)
    word = philox_reference(seed, stream, position)[..., 0].astype(np.float64)
    uniform = (np.floor(word / 256.0) + 0.5) * 2.0**-24
    gumbel = torch.from_numpy(-np.log(-np.log(uniform))).to(logits.device)
    return (logits.double() / temperature + gumbel).argmax(-1)


def forward(w: LlamaWeights, cfg: LlamaConfig, tokens: torch.Tensor, cache: KVCache, start_slot: int,
            kv_start: torch.Tensor, inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """Run ``tokens`` [B, T] at slots ``start_slot .. start_slot + T − 1``; fill the cache; logits [B, T, V].

    ``kv_start`` [B]: the first valid slot of each row (its left padding).
    """
    B, T = tokens.shape
    inv_freq = cfg.rope_inv_freq() if inv_freq is None else inv_freq
    slots = torch.arange(start_slot, start_slot + T, device=tokens.device)
    positions = (slots[None, :] - kv_start.to(tokens.device)[:, None]).clamp_min(0)
    x = w.embed[tokens].to(w.dtype)
    for layer in range(cfg.num_hidden_layers):
        q, k, v = qkv_step(w, cfg, layer, x, positions, inv_freq)
        cache.k[layer, :, :, start_slot:start_slot + T] = k.transpose(1, 2).to(cache.k.dtype)
        cache.v[layer, :, :, start_slot:start_slot + T] = v.transpose(1, 2).to(cache.v.dtype)
        attn = attention_step(q, cache.k[layer], cache.v[layer], slots, kv_start)
        x = o_proj_step(w, layer, attn, x)
        x = down_step(w, layer, mlp_step(w, cfg, layer, x), x)
    return lm_head_step(w, cfg, x)


class ReferenceDecoder:
    """The reference decoder as a stateful object (the benchmark's unfused baseline).

    ``step(tokens [B])`` runs one decode step at the next slot and returns logits [B, V];
    ``step_at(tokens, slot)`` takes the slot as a 0-d device tensor, so that
    ``torch.compile(step_at, mode="reduce-overhead", fullgraph=True)`` serves every step
    with one CUDA graph.  ``cache`` lets it share another decoder's cache.
    """

    def __init__(self, weights: LlamaWeights, config: LlamaConfig, batch: int, max_slots: int,
                 cache: KVCache | None = None):
        self.w, self.cfg = weights, config
        if cache is None:
            cache = KVCache.empty(config, batch, max_slots, dtype=weights.dtype, device=weights.device)
        self.cache = cache
        self.inv_freq = config.rope_inv_freq().to(weights.device)
        self.kv_start = torch.zeros(batch, dtype=torch.int64, device=weights.device)
        self.slot = torch.zeros((), dtype=torch.int64, device=weights.device)

    def step_at(self, tokens: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """One token per row at cache slot ``slot`` (a 0-d device tensor); logits [B, V]."""
        w, cfg = self.w, self.cfg
        x = w.embed[tokens][:, None].to(w.dtype)
        positions = (slot - self.kv_start)[:, None]
        slots = slot.reshape(1)
        for layer in range(cfg.num_hidden_layers):
            q, k, v = qkv_step(w, cfg, layer, x, positions, self.inv_freq)
            self.cache.k[layer].index_copy_(2, slots, k.transpose(1, 2).to(self.cache.k.dtype))
            self.cache.v[layer].index_copy_(2, slots, v.transpose(1, 2).to(self.cache.v.dtype))
            attn = attention_step(q, self.cache.k[layer], self.cache.v[layer], slots, self.kv_start)
            x = o_proj_step(w, layer, attn, x)
            x = down_step(w, layer, mlp_step(w, cfg, layer, x), x)
        return lm_head_step(w, cfg, x)[:, 0]

    def compiled_step_at(self):
        """``step_at`` under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA graphs).

        Weights and cache are marked as static addresses, as gpt-fast's module buffers are,
        so that the CUDA graph reads them in place instead of copying them in every call.
        """
        for t in (*(t for t in self.w.__dict__.values() if t is not None), self.cache.k, self.cache.v,
                  self.inv_freq, self.kv_start):
            torch._dynamo.mark_static_address(t)
        return torch.compile(self.step_at, mode="reduce-overhead", fullgraph=True)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.step_at(tokens, self.slot)
        self.slot.add_(1)
        return logits
