"""The user-facing engine: :func:`from_pretrained` and :class:`LlamaModel`'s generate loop.

``prefill`` runs the prompt through the reference decoder (matrix products and
``scaled_dot_product_attention``) and fills the static KV cache; every following token is
one fused decode step — five fused launches per layer plus the LM head (four at batch 1,
where Q/K/V and attention share one; ``looped=False``) or one looped launch for all layers
(``looped=True``: dependency-ordered one-tile programs on the GPU at batch 1, a
persistent grid otherwise; see :func:`llmfuse.ops.looped_decode`).  Greedy decoding takes the argmax
fused into the LM head; sampling (temperature, top-k, top-p) runs on the logits with a
seeded torch generator.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fusecore import PhiloxStream, backend

from . import ops
from . import reference as ref
from .config import LlamaConfig
from .weights import LlamaWeights, weights_from_checkpoint, weights_from_hf_model

ENGINE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The smallest sampling temperature: logits / temperature stays finite in float32 for any logit below 1e32.
MIN_TEMPERATURE = 1e-6


def _check_int(name: str, value: Any, lo: int) -> int:
    if not backend.is_int(value) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    return int(value)


def _token_list(name: str, value: Any, vocab: int, allow_empty: bool) -> list[int]:
    """A token id or a list / tuple / 1-d int tensor of them, checked against the vocabulary."""
    if isinstance(value, torch.Tensor):
        value = value.tolist() if value.dim() <= 1 and not value.dtype.is_floating_point else value
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if (not items and not allow_empty) or any(not backend.is_int(e) or not 0 <= e < vocab for e in items):
        raise ValueError(f"{name} must be a token id or a {'' if allow_empty else 'non-empty '}list of token ids "
                         f"in [0, {vocab}), got {value!r}")
    return [int(e) for e in items]


def sample_tokens(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                  generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of float logits [B, V] (temperature > 0), top-k then top-p filtered."""
    scores = logits.float() / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cum = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_scores, dim=-1) >= top_p  # keep the smallest prefix reaching top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, sorted_scores)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class LlamaModel:
    """A Llama-family decoder with a static KV cache of ``max_seq_len`` slots and fused decode.

    ``looped`` selects the looped kernel (one launch per step) instead of the
    per-layer fused launches; ``cuda_graph`` (default: on for CUDA weights) replays each
    step from a CUDA graph.  The cache holds ``max_batch_size`` rows; it is re-created
    (same length) when a call uses another batch size.
    """

    def __init__(self, config: LlamaConfig, weights: LlamaWeights, *, max_seq_len: int | None = None,
                 max_batch_size: int = 1, looped: bool = False, cuda_graph: bool | None = None,
                 eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None):
        self.config = config
        self.weights = weights
        self.device = weights.device
        self.dtype = weights.dtype
        if self.dtype not in ENGINE_DTYPES:
            raise TypeError(f"dtype must be one of {ENGINE_DTYPES}, got {self.dtype}")
        try:  # the kernels run where the backend runs them: say so now, not at the first decode step
            backend.check_devices(weights=weights.wqkv)
        except ValueError as exc:
            raise ValueError(f"device {str(self.device)!r} cannot run the decode kernels: {exc}") from exc
        if max_seq_len is None:
            max_seq_len = min(config.max_position_embeddings, 4096)
        self.max_seq_len = _check_int("max_seq_len", max_seq_len, 1)
        # generate()'s defaults, as transformers' generation config: stop at the model's end-of-sequence
        # tokens (the config's unless given) and pad finished rows with pad_token_id (the config's unless given; else
        # the first of them)
        self.eos_token_id = tuple(_token_list("eos_token_id", config.eos_token_id if eos_token_id is None
                                              else eos_token_id, config.vocab_size, allow_empty=True))
        self.pad_token_id = config.pad_token_id if pad_token_id is None else _token_list(
            "pad_token_id", pad_token_id, config.vocab_size, allow_empty=False)[0]
        self.looped = bool(looped)
        self.cuda_graph = self.device.type == "cuda" if cuda_graph is None else bool(cuda_graph)
        if self.cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, the weights are on {self.device}")
        self.inv_freq = config.rope_inv_freq().to(self.device)
        self._setup(_check_int("max_batch_size", max_batch_size, 1))

    def _setup(self, batch: int) -> None:
        plan = ops.make_plan(self.config, batch, self.max_seq_len, self.dtype, self.device)  # may refuse: first
        self.batch = batch
        self.cache = ref.KVCache.empty(self.config, batch, self.max_seq_len, dtype=self.dtype, device=self.device)
        self.plan = plan
        self.buffers = ops.DecodeBuffers.allocate(self.config, self.plan, self.dtype, self.device)
        self.position = 0  # host copy of buffers.slot: the next slot to fill
        self._tokens_in = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self._graphs: dict[tuple[bool, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    # ------------------------------------------------------------------ input checks
    def _check_ids(self, name: str, ids: Any, dims: int) -> torch.Tensor:
        backend.check_dtypes((torch.int64, torch.int32), **{name: ids})
        if ids.dim() != dims:
            raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(ids.shape)}")
        if ids.shape[0] == 0:
            raise ValueError(f"{name} must hold at least one row, got shape {tuple(ids.shape)}")
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.config.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {self.config.vocab_size})")
        return ids.to(device=self.device, dtype=torch.int64)

    def _kv_start(self, attention_mask: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
        B, T = shape
        if attention_mask is None:
            return torch.zeros(B, dtype=torch.int64, device=self.device)
        if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (B, T):
            raise ValueError(f"attention_mask must be a tensor of shape {(B, T)} like input_ids, got "
                             f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
        mask = attention_mask.to("cpu")
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError("attention_mask must hold only 0 and 1")
        mask = mask.to(torch.int64)
        pads = (mask == 0).sum(1)
        left = torch.arange(T)[None, :] < pads[:, None]
        if not torch.equal(mask == 0, left):
            raise ValueError("attention_mask must be left-padded (zeros only before the first 1 of each row)")
        if bool((pads == T).any()):
            raise ValueError("attention_mask has a row with no token (all zeros)")
        return pads.to(self.device)

    # ------------------------------------------------------------------ steps
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Reset the cache, run the prompt [B, T] (left-padded per ``attention_mask``); last logits [B, V].

        Uses the unfused reference path (matrix products, SDPA) and fills the same cache the
        fused decode steps read.  Returns float32 logits of each row's last prompt token.
        """
        ids = self._check_ids("input_ids", input_ids, 2)
        B, T = ids.shape
        if T < 1:
            raise ValueError("input_ids must hold at least one token per row")
        if T > self.max_seq_len:
            raise ValueError(f"prompt of {T} tokens is longer than the cache (max_seq_len={self.max_seq_len})")
        kv_start = self._kv_start(attention_mask, ids.shape)
        if B != self.batch:
            self._setup(B)
        self.cache.k.zero_()
        self.cache.v.zero_()
        logits = ref.forward(self.weights, self.config, ids, self.cache, 0, kv_start, self.inv_freq)
        self.buffers.kv_start.copy_(kv_start)
        self.buffers.slot.fill_(T)
        self.position = T
        return logits[:, -1].float()

    def _step(self, tokens: torch.Tensor, write_logits: bool, sample: bool = False) -> torch.Tensor:
        """Feed ``tokens`` at the next slot; the next tokens (greedy, or Gumbel-max sampled)."""
        if self.position >= self.max_seq_len:
            raise ValueError(f"the cache is full: {self.position} of max_seq_len={self.max_seq_len} slots used; "
                             "create the model with a larger max_seq_len")
        if backend.reference_enabled():
            logits = ref.forward(self.weights, self.config, tokens[:, None], self.cache, self.position,
                                 self.buffers.kv_start, self.inv_freq)[:, 0].float()
            self.buffers.logits.copy_(logits)
            if sample:
                nxt = ref.gumbel_sample(logits, 1.0 / float(self.buffers.inv_temperature), int(self.buffers.seed),
                                        self.position)
            else:
                nxt = logits.argmax(-1)
        else:
            nxt = self._fused(tokens, write_logits, sample)
        self.buffers.slot.add_(1)
        self.position += 1
        return nxt

    def _run_fused(self, tokens: torch.Tensor, write_logits: bool, sample: bool) -> torch.Tensor:
        return ops.fused_step(self.weights, self.config, self.cache, self.buffers, self.plan, self.inv_freq,
                              tokens, looped=self.looped, write_logits=write_logits, sample=sample)

    def _fused(self, tokens: torch.Tensor, write_logits: bool, sample: bool) -> torch.Tensor:
        """One fused step; on the GPU replayed from a CUDA graph captured at first use.

        The step reads its slot from ``buffers.slot`` on the device and is idempotent at a
        given slot, so the warm-up run before capture leaves the same state as the replay.
        """
        if not self.cuda_graph:
            return self._run_fused(tokens, write_logits, sample)
        self._tokens_in.copy_(tokens)
        key = (write_logits, sample)
        if key not in self._graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compiles the kernels outside the capture
                self._run_fused(self._tokens_in, write_logits, sample)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                nxt = self._run_fused(self._tokens_in, write_logits, sample)
            self._graphs[key] = (graph, nxt)
        graph, nxt = self._graphs[key]
        graph.replay()
        return nxt.clone()

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (after :meth:`prefill`); float32 logits [B, V] of the next token."""
        ids = self._check_ids("tokens", tokens, 1)
        if self.position == 0:
            raise ValueError("call prefill(input_ids) before decode_step")
        if ids.shape[0] != self.batch:
            raise ValueError(f"tokens must have {self.batch} rows (the prefill batch), got {ids.shape[0]}")
        self._step(ids, write_logits=True)
        return self.buffers.logits.clone()

    def _check_generation(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float,
                          top_k: int | None, top_p: float | None, seed: int | None = None,
                          eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None,
                          attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """The checked prompt and the generation settings (``max_new_tokens``, ``temperature``, ``top_k``,
        ``top_p``, ``seed``, ``eos`` (a list, the model's by default), ``pad``) as plain Python values;
        ``attention_mask`` is checked here too (``prefill`` reads it again)."""
        max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 0)
        if seed is not None and (not backend.is_int(seed) or not 0 <= seed < 2**63):
            raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
        if isinstance(temperature, bool) or not (isinstance(temperature, numbers.Real) and 0 <= temperature < math.inf):
            raise ValueError(f"temperature must be a finite float >= 0, got {temperature!r}")
        if 0 < temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, got {temperature!r}")
        if top_k is not None:
            top_k = _check_int("top_k", top_k, 1)
        if top_p is not None and (isinstance(top_p, bool) or not (isinstance(top_p, numbers.Real) and 0 < top_p <= 1)):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        vocab = self.config.vocab_size
        eos = list(self.eos_token_id) if eos_token_id is None else _token_list("eos_token_id", eos_token_id, vocab,
                                                                               allow_empty=True)
        if pad_token_id is None:
            pad = self.pad_token_id if self.pad_token_id is not None else (eos[0] if eos else None)
        else:
            pad = _token_list("pad_token_id", pad_token_id, vocab, allow_empty=False)[0]
        ids = self._check_ids("input_ids", input_ids, 2)
        T = ids.shape[1]
        if T + max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt ({T}) + max_new_tokens ({max_new_tokens}) = {T + max_new_tokens} exceeds the "
                             f"cache (max_seq_len={self.max_seq_len})")
        self._kv_start(attention_mask, ids.shape)  # at the call: stream() is lazy, max_new_tokens=0 never prefills
        settings = {"max_new_tokens": max_new_tokens, "temperature": float(temperature), "top_k": top_k,
                    "top_p": None if top_p is None else float(top_p), "seed": None if seed is None else int(seed),
                    "eos": eos, "pad": pad}
        return ids, settings

    def stream(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, eos_token_id: int | list[int] | None = None,
               seed: int | None = None, attention_mask: torch.Tensor | None = None,
               pad_token_id: int | None = None) -> Iterator[torch.Tensor]:
        """Yield the new tokens one step at a time, each a LongTensor [B] (arguments as :meth:`generate`).
        The arguments are checked when ``stream`` is called, before the first token is asked for."""
        ids, settings = self._check_generation(input_ids, max_new_tokens, temperature, top_k, top_p, seed,
                                               eos_token_id, pad_token_id, attention_mask)
        return self._tokens(ids, attention_mask, **settings)

    @torch.no_grad()
    def _tokens(self, ids: torch.Tensor, attention_mask: torch.Tensor | None, *, max_new_tokens: int,
                temperature: float, top_k: int | None, top_p: float | None, seed: int | None, eos: list[int],
                pad: int | None) -> Iterator[torch.Tensor]:
        eos_t = torch.tensor(eos, dtype=torch.int64, device=self.device)
        # Temperature-only sampling is fused into the LM head (Gumbel-max, Philox); top-k / top-p
        # need the whole distribution and sample the written logits on the host.
        fused_sampling = temperature > 0 and top_k is None and (top_p is None or top_p >= 1)
        if seed is None:
            seed = PhiloxStream.from_torch().seed
        gen = None
        if temperature > 0 and not fused_sampling:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        if max_new_tokens == 0:
            return
        logits = self.prefill(ids, attention_mask)
        self.buffers.seed.fill_(seed)
        self.buffers.inv_temperature.fill_(1.0 / temperature if temperature > 0 else 1.0)
        finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=self.device)
        if temperature == 0:
            token = logits.argmax(-1)
        elif fused_sampling:
            token = ref.gumbel_sample(logits, temperature, seed, self.position - 1)
        else:
            token = sample_tokens(logits, temperature, top_k, top_p, gen)
        for step in range(max_new_tokens):
            if eos:
                token = torch.where(finished, pad, token)
                finished |= torch.isin(token, eos_t)
            yield token
            if step + 1 == max_new_tokens or (eos and bool(finished.all())):
                return
            nxt = self._step(token, write_logits=temperature > 0 and not fused_sampling, sample=fused_sampling)
            token = nxt if temperature == 0 or fused_sampling else sample_tokens(
                self.buffers.logits, temperature, top_k, top_p, gen)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, eos_token_id: int | list[int] | None = None,
                 seed: int | None = None, attention_mask: torch.Tensor | None = None,
                 pad_token_id: int | None = None) -> torch.Tensor:
        """Prompt [B, T] followed by up to ``max_new_tokens`` new tokens: LongTensor [B, T + new].

        Greedy when ``temperature == 0`` (else ``temperature`` >= :data:`MIN_TEMPERATURE`).  Sampling with
        temperature only is fused into the LM head (Gumbel-max with Philox noise keyed by ``seed``: no logits
        leave the kernel); with ``top_k`` / ``top_p`` the logits are written and sampled on the host
        (temperature, then top-k, then top-p) with a generator seeded by ``seed``.  ``attention_mask`` [B, T]
        marks left padding.  As transformers' ``generate``: a row stops at any of ``eos_token_id`` (default:
        the model's, from its ``generation_config.json`` or ``config.json``; ``[]``: never stop), later
        positions of a finished row hold ``pad_token_id`` (default: the model's, else the first
        end-of-sequence id), and generation ends early when every row has finished.
        """
        ids, settings = self._check_generation(input_ids, max_new_tokens, temperature, top_k, top_p, seed,
                                               eos_token_id, pad_token_id, attention_mask)
        new = list(self._tokens(ids, attention_mask, **settings))
        return torch.cat([ids, *(t[:, None] for t in new)], dim=1)


def from_pretrained(path_or_hf_model: str | Path | torch.nn.Module, *, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None, max_seq_len: int | None = None, max_batch_size: int = 1,
                    looped: bool = False, cuda_graph: bool | None = None) -> LlamaModel:
    """Load a Llama-family model from a checkpoint directory or an in-memory transformers model.

    ``device`` defaults to fusekit's kernel device; ``dtype`` to bfloat16 on the GPU and float32
    on the CPU.  ``max_seq_len`` sizes the static KV cache (default min(max_position_embeddings, 4096)).
    ``looped`` picks the looped kernel (one launch per step); ``cuda_graph`` (default: on for CUDA) replays
    each decode step from a CUDA graph.
    """
    device = torch.device(device) if device is not None else backend.default_device()
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in ENGINE_DTYPES:
        raise TypeError(f"dtype must be one of {ENGINE_DTYPES}, got {dtype}")
    if isinstance(path_or_hf_model, torch.nn.Module):
        if not hasattr(path_or_hf_model, "config"):
            raise TypeError("path_or_hf_model must be a transformers model (with .config) or a directory path")
        config = LlamaConfig.from_hf(path_or_hf_model.config)
        generation = getattr(path_or_hf_model, "generation_config", None)
        generation = {} if generation is None else {k: getattr(generation, k, None)
                                                    for k in ("eos_token_id", "pad_token_id")}
        weights = weights_from_hf_model(path_or_hf_model, config, dtype=dtype, device=device)
    elif isinstance(path_or_hf_model, (str, Path)):
        directory = Path(path_or_hf_model)
        if not directory.is_dir():
            raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
        config = LlamaConfig.from_json(directory / "config.json")
        generation = _generation_config(directory / "generation_config.json")
        weights = weights_from_checkpoint(directory, config, dtype=dtype, device=device)
    else:
        raise TypeError("path_or_hf_model must be a path or a transformers model, "
                        f"got {type(path_or_hf_model).__name__}")
    return LlamaModel(config, weights, max_seq_len=max_seq_len, max_batch_size=max_batch_size, looped=looped,
                      cuda_graph=cuda_graph, eos_token_id=generation.get("eos_token_id"),
                      pad_token_id=generation.get("pad_token_id"))


def _generation_config(path: Path) -> dict[str, Any]:
    """``eos_token_id`` and ``pad_token_id`` of a checkpoint's ``generation_config.json`` (what transformers'
    ``generate`` stops at and pads with; an instruct model's end-of-turn token is often only there), or {}: then
    the config's (:class:`~llmfuse.config.LlamaConfig`), as transformers takes them."""
    if not path.is_file():
        return {}
    try:
        fields = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(fields).__name__}")
    return {k: fields.get(k) for k in ("eos_token_id", "pad_token_id")}
