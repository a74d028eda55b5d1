"""Model configuration read from a Hugging Face ``config.json`` (or a transformers config).

Supported: the Llama decoder family — ``LlamaForCausalLM`` (Llama 2, 3, 3.1, 3.2),
``MistralForCausalLM`` without an active sliding window and ``Qwen2ForCausalLM`` (bias on
the Q/K/V projections) — with SiLU-gated MLPs, grouped-query attention, tied or untied
embeddings and RoPE of type ``default``, ``linear`` or ``llama3``.  Anything else raises a
``ValueError`` naming the config field that is not supported.

RoPE inverse frequencies (``rope_inv_freq``) follow transformers'
``modeling_rope_utils``: ``inv_freq_j = θ^(−2j/D)``; ``linear`` divides by ``factor``;
``llama3`` divides low frequencies (wavelength > original_max / low_freq_factor) by
``factor``, keeps high ones, and interpolates between.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_MODEL_TYPES = set(SUPPORTED_ARCHITECTURES.values())
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Llama-family config that the decoder needs.

    Shapes: hidden ``H = hidden_size``, query heads ``Hq``, KV heads ``Hkv`` (``Hq % Hkv == 0``),
    head dim ``D``, MLP width ``I = intermediate_size``, vocabulary ``V``, ``L`` layers.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 2048
    model_type: str = "llama"
    eos_token_id: tuple[int, ...] = field(default_factory=tuple)
    # what transformers pads finished rows with where no generation_config.json names one; an id outside the
    # vocabulary (old conversions write -1) counts as none
    pad_token_id: int | None = None

    @property
    def group_size(self) -> int:
        """Query heads per KV head (``Hq / Hkv``)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def qkv_rows(self) -> int:
        """Output rows of the fused Q/K/V projection: ``(Hq + 2 Hkv) D``."""
        return (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim

    def num_parameters(self) -> int:
        """Parameters of the model (the LM head counted once when tied)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        per_layer = (
            h * self.qkv_rows + self.num_attention_heads * d * h + 3 * h * i + 2 * h
            + (self.qkv_rows if self.attention_bias else 0)
        )
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embed + h

    def rope_inv_freq(self) -> torch.Tensor:
        """float32 [D/2] inverse frequencies, scaling applied (see the module docstring)."""
        d = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        scaling = self.rope_scaling or {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "linear":
            return inv_freq / float(scaling["factor"])
        if rope_type == "llama3":
            factor = float(scaling["factor"])
            low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
            old_len = float(scaling["original_max_position_embeddings"])
            low_wavelen, high_wavelen = old_len / low, old_len / high
            wavelen = 2 * math.pi / inv_freq
            scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
            smooth = (old_len / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
            return torch.where(medium, smoothed, scaled)
        return inv_freq

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], source: str = "config") -> LlamaConfig:
        """Validate a config.json dictionary; every unsupported or malformed field is named.

        Unsupported features raise ``ValueError``; a field of the wrong type ``TypeError``; a
        missing required field or a value out of range ``ValueError``.
        """
        if not isinstance(cfg, dict):
            raise TypeError(f"{source}: a config must be a JSON object (dict), got {type(cfg).__name__}")

        def integer(name: str, lo: int = 1, default: int | None = None) -> int:
            value = cfg.get(name)
            value = default if value is None else value
            if value is None:
                raise ValueError(f"{source}: required field {name!r} is missing")
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{source}: field {name!r} = {value!r} must be an integer")
            if value < lo:
                raise ValueError(f"{source}: field {name!r} = {value} must be >= {lo}")
            return value

        def positive(name: str, value: Any) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{source}: field {name!r} = {value!r} must be a number")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{source}: field {name!r} = {value!r} must be a finite number > 0")
            return float(value)

        archs = cfg.get("architectures") or []
        if not isinstance(archs, list):
            raise TypeError(f"{source}: field 'architectures' = {archs!r} must be a list of class names")
        for arch in archs:
            if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
                raise ValueError(
                    f"{source}: field 'architectures' = {archs!r} is not supported; "
                    f"llmfuse runs {sorted(SUPPORTED_ARCHITECTURES)}"
                )
        families = {SUPPORTED_ARCHITECTURES[arch] for arch in archs}
        if len(families) > 1:
            raise ValueError(f"{source}: field 'architectures' = {archs!r} names more than one model family")
        # the family decides the weights (Qwen2's Q/K/V biases): without 'model_type' it comes from the
        # architecture, and a 'model_type' that contradicts the architecture is refused, not guessed
        model_type = cfg.get("model_type", next(iter(families)) if families else "llama")
        if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{source}: field 'model_type' = {model_type!r} is not supported; "
                f"expected one of {sorted(SUPPORTED_MODEL_TYPES)}"
            )
        if families and model_type not in families:
            raise ValueError(
                f"{source}: field 'model_type' = {model_type!r} contradicts field 'architectures' = {archs!r} "
                f"(a {next(iter(families))!r} model)"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{source}: field 'hidden_act' = {act!r} is not supported; only 'silu'")
        if cfg.get("mlp_bias"):
            raise ValueError(f"{source}: field 'mlp_bias' = True is not supported")
        if model_type != "qwen2" and cfg.get("attention_bias"):
            raise ValueError(
                f"{source}: field 'attention_bias' = True is not supported for {model_type!r} "
                "(only Qwen2's bias on the Q/K/V projections is)"
            )
        if cfg.get("pretraining_tp", 1) not in (1, None):
            raise ValueError(f"{source}: field 'pretraining_tp' = {cfg['pretraining_tp']!r} is not supported; only 1")
        if model_type in ("mistral", "qwen2"):
            window = cfg.get("sliding_window")
            uses_window = cfg.get("use_sliding_window", model_type == "mistral")
            if uses_window and window is not None:
                raise ValueError(
                    f"{source}: field 'sliding_window' = {window!r} is not supported "
                    "(llmfuse attends over the whole cache); set it to null"
                )
        hidden = integer("hidden_size")
        heads = integer("num_attention_heads")
        kv_heads = integer("num_key_value_heads", default=heads)
        head_dim = integer("head_dim", default=hidden // heads)
        if heads % kv_heads:
            raise ValueError(
                f"{source}: field 'num_key_value_heads' = {kv_heads} must divide num_attention_heads = {heads}"
            )
        if head_dim % 2:
            raise ValueError(f"{source}: field 'head_dim' = {head_dim} must be even for RoPE")

        # transformers 5 writes 'rope_parameters'; older configs 'rope_theta' + 'rope_scaling'.
        params = cfg.get("rope_parameters") or {}
        if not isinstance(params, dict):
            raise TypeError(f"{source}: field 'rope_parameters' = {params!r} must be an object")
        theta = positive("rope_theta", params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = cfg.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"} or None
        if scaling is not None:
            field_name = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
            scaling = _check_rope_scaling(scaling, f"{source}: field {field_name!r}", positive)
        eos = cfg.get("eos_token_id")
        eos_list = [] if eos is None else (eos if isinstance(eos, list) else [eos])
        if any(isinstance(e, bool) or not isinstance(e, int) for e in eos_list):
            raise TypeError(f"{source}: field 'eos_token_id' = {eos!r} must be an integer or a list of integers")
        vocab = integer("vocab_size")
        if any(not 0 <= e < vocab for e in eos_list):
            raise ValueError(f"{source}: field 'eos_token_id' = {eos!r} is outside the vocabulary [0, {vocab})")
        pad = cfg.get("pad_token_id")
        pad = pad if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < vocab else None
        tie = cfg.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise TypeError(f"{source}: field 'tie_word_embeddings' = {tie!r} must be true or false")
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=integer("intermediate_size"),
            num_hidden_layers=integer("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=positive("rms_norm_eps", cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=tie,
            attention_bias=model_type == "qwen2",
            max_position_embeddings=integer("max_position_embeddings", default=2048),
            model_type=model_type,
            eos_token_id=tuple(eos_list),
            pad_token_id=pad,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> LlamaConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        try:
            cfg = json.loads(path.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"config file {path} is not valid JSON: {exc}") from exc
        return cls.from_dict(cfg, source=str(path))

    @classmethod
    def from_hf(cls, hf_config: Any) -> LlamaConfig:
        """From a transformers ``PretrainedConfig`` object."""
        return cls.from_dict(hf_config.to_dict(), source=f"{type(hf_config).__name__}")


def _check_rope_scaling(scaling: Any, where: str, positive: Callable[[str, Any], float]) -> dict[str, Any] | None:
    """The RoPE scaling dictionary, checked: a supported type with every parameter it needs."""
    if not isinstance(scaling, dict):
        raise TypeError(f"{where} = {scaling!r} must be an object")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if not isinstance(rope_type, str) or rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{where} has rope_type {rope_type!r}, which is not supported; "
                         f"expected one of {SUPPORTED_ROPE_TYPES}")
    if positive("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return None
    needed = {"linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
    for name in needed[rope_type]:
        if name not in scaling:
            raise ValueError(f"{where}: rope_type {rope_type!r} needs {name!r}, which is missing")
        positive(name, scaling[name])
    if rope_type == "llama3" and not float(scaling["high_freq_factor"]) > float(scaling["low_freq_factor"]):
        raise ValueError(f"{where}: high_freq_factor = {scaling['high_freq_factor']!r} must be greater than "
                         f"low_freq_factor = {scaling['low_freq_factor']!r}")
    return dict(scaling)
