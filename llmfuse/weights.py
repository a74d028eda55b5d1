"""Weights of a Llama-family model, stacked per layer, and loading them from checkpoints.

:class:`LlamaWeights` holds every parameter stacked along a leading layer axis so that one
kernel (the looped decode kernel) can walk all layers through one pointer per matrix:

=================  ==========================  =========================================
field              shape                       Hugging Face tensor(s)
=================  ==========================  =========================================
``embed``          [V, H]                      ``model.embed_tokens.weight``
``wqkv``           [L, (Hq + 2 Hkv) D, H]      ``q_proj``, ``k_proj``, ``v_proj`` rows stacked
``bqkv``           [L, (Hq + 2 Hkv) D] / None  their biases (Qwen2)
``wo``             [L, H, Hq D]                ``o_proj``
``attn_norm``      [L, H]                      ``input_layernorm``
``w_gate_up``      [L, 2 I, H]                 ``gate_proj`` rows then ``up_proj`` rows
``w_down``         [L, H, I]                   ``down_proj``
``mlp_norm``       [L, H]                      ``post_attention_layernorm``
``final_norm``     [H]                         ``model.norm.weight``
``lm_head``        [V, H]                      ``lm_head.weight`` (``embed`` itself when tied)
=================  ==========================  =========================================

Sources: a checkpoint directory (``config.json`` + ``model.safetensors`` or a sharded
``model.safetensors.index.json``) or an in-memory transformers model.  Every missing,
mis-shaped, corrupt or unreadable tensor raises an error naming the file and the tensor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from .config import LlamaConfig

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SUPPORTED_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)  # float64: oracles


class CheckpointError(ValueError):
    """A checkpoint is missing a tensor, has one of the wrong shape, or cannot be read."""


@dataclass
class LlamaWeights:
    """All parameters of the decoder, stacked per layer (see the module docstring)."""

    embed: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    attn_norm: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    mlp_norm: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.wqkv.dtype

    @property
    def device(self) -> torch.device:
        return self.wqkv.device

    def nbytes(self) -> int:
        """Bytes of distinct parameter storage (a tied LM head counted once)."""
        seen, total = set(), 0
        for f in fields(self):
            t = getattr(self, f.name)
            if t is None or t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        return total

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> LlamaWeights:
        tied = self.lm_head.data_ptr() == self.embed.data_ptr()
        moved = {
            f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device=device, dtype=dtype)
            for f in fields(self)
        }
        if tied:
            moved["lm_head"] = moved["embed"]
        return LlamaWeights(**moved)


def random_weights(
    config: LlamaConfig,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    std: float = 0.02,
) -> LlamaWeights:
    """Random weights of the config's shapes (normal(0, std) matrices, norms near 1)."""
    c = config
    L, H, Iw, V = c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size

    # drawn where the generator lives (CPU by default), then moved
    draw_on = generator.device if generator is not None else torch.device(device)

    def normal(*shape: int, scale: float = std) -> torch.Tensor:
        t = torch.empty(shape, dtype=torch.float32, device=draw_on)
        t.normal_(0.0, scale, generator=generator)
        return t.to(device=device, dtype=dtype)

    def norm(*shape: int) -> torch.Tensor:
        return (1.0 + normal(*shape, scale=0.1).float()).to(dtype)

    embed = normal(V, H)
    return LlamaWeights(
        embed=embed,
        wqkv=normal(L, c.qkv_rows, H),
        bqkv=normal(L, c.qkv_rows) if c.attention_bias else None,
        wo=normal(L, H, c.num_attention_heads * c.head_dim),
        attn_norm=norm(L, H),
        w_gate_up=normal(L, 2 * Iw, H),
        w_down=normal(L, H, Iw),
        mlp_norm=norm(L, H),
        final_norm=norm(H),
        lm_head=embed if c.tie_word_embeddings else normal(V, H),
    )


TensorGetter = Callable[[str], torch.Tensor]


def _expected_tensors(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor names and shapes that a checkpoint of ``config`` must hold."""
    c = config
    H, D, Iw = c.hidden_size, c.head_dim, c.intermediate_size
    hq, hkv = c.num_attention_heads, c.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, H), "model.norm.weight": (H,)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (hq * D, H)
        shapes[p + "self_attn.k_proj.weight"] = (hkv * D, H)
        shapes[p + "self_attn.v_proj.weight"] = (hkv * D, H)
        if c.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (hq * D,)
            shapes[p + "self_attn.k_proj.bias"] = (hkv * D,)
            shapes[p + "self_attn.v_proj.bias"] = (hkv * D,)
        shapes[p + "self_attn.o_proj.weight"] = (H, hq * D)
        shapes[p + "mlp.gate_proj.weight"] = (Iw, H)
        shapes[p + "mlp.up_proj.weight"] = (Iw, H)
        shapes[p + "mlp.down_proj.weight"] = (H, Iw)
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, H)
    return shapes


def assemble_weights(
    config: LlamaConfig,
    get: TensorGetter,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    where: Callable[[str], str] = lambda name: "the model",
    names: Iterable[str] | None = None,
    shape_of: Callable[[str], tuple[int, ...]] | None = None,
) -> LlamaWeights:
    """Build :class:`LlamaWeights` from a name -> tensor getter, checking every shape.

    ``where(name)`` says where tensor ``name`` comes from (a file), for error messages.
    ``names`` (every stored tensor name) lets the layer count be checked against the config,
    and ``shape_of`` (a shape without reading the data) every name and shape, before
    anything is read or allocated.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype}")
    if names is not None:
        _check_layer_count(config, names, where)  # first: a config of 10**9 layers is refused before its names
    expected = _expected_tensors(config)
    if shape_of is not None:
        for name, shape in expected.items():
            found = tuple(shape_of(name))
            if found != shape:
                raise CheckpointError(f"tensor {name!r} in {where(name)} has shape {found}, "
                                      f"expected {shape} for this config")
    if names is not None:
        # after the expected names: a misspelt tensor is reported as the missing one it should have been
        _check_unexpected(config, names, expected, where)

    def load(name: str) -> torch.Tensor:
        tensor = get(name)
        if tuple(tensor.shape) != expected[name]:
            raise CheckpointError(
                f"tensor {name!r} in {where(name)} has shape {tuple(tensor.shape)}, "
                f"expected {expected[name]} for this config"
            )
        if not tensor.dtype.is_floating_point:
            raise CheckpointError(f"tensor {name!r} in {where(name)} has dtype {tensor.dtype}, expected a float")
        converted = tensor.to(device=device, dtype=dtype)
        if not bool(torch.isfinite(converted).all()):
            where_bad = "" if torch.isfinite(tensor).all() else " (already in the file)"
            raise CheckpointError(f"tensor {name!r} in {where(name)} holds NaN or infinite values in {dtype}"
                                  f"{where_bad}: the checkpoint is corrupt or does not fit this dtype")
        return converted

    c = config
    L = c.num_hidden_layers

    def stacked(rows_of: Callable[[int], list[str]]) -> torch.Tensor:
        first = torch.cat([load(n) for n in rows_of(0)], 0)
        out = torch.empty((L, *first.shape), dtype=dtype, device=device)
        out[0] = first
        for i in range(1, L):
            out[i] = torch.cat([load(n) for n in rows_of(i)], 0)
        return out

    attn = "model.layers.{}.self_attn.{}_proj.{}"
    mlp = "model.layers.{}.mlp.{}_proj.weight"
    embed = load("model.embed_tokens.weight")
    return LlamaWeights(
        embed=embed,
        wqkv=stacked(lambda i: [attn.format(i, p, "weight") for p in "qkv"]),
        bqkv=stacked(lambda i: [attn.format(i, p, "bias") for p in "qkv"]) if c.attention_bias else None,
        wo=stacked(lambda i: [attn.format(i, "o", "weight")]),
        attn_norm=stacked(lambda i: [f"model.layers.{i}.input_layernorm.weight"]),
        w_gate_up=stacked(lambda i: [mlp.format(i, "gate"), mlp.format(i, "up")]),
        w_down=stacked(lambda i: [mlp.format(i, "down")]),
        mlp_norm=stacked(lambda i: [f"model.layers.{i}.post_attention_layernorm.weight"]),
        final_norm=load("model.norm.weight"),
        lm_head=embed if c.tie_word_embeddings else load("lm_head.weight"),
    )


def weights_from_hf_model(model: torch.nn.Module, config: LlamaConfig, *, dtype: torch.dtype,
                          device: torch.device | str) -> LlamaWeights:
    """Weights of an in-memory transformers ``*ForCausalLM`` model."""
    state = dict(model.state_dict())

    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise CheckpointError(f"tensor {name!r} is missing from the model's state_dict {_near(name, state)}")
        return state[name].detach()

    return assemble_weights(config, get, dtype=dtype, device=device, names=state,
                            shape_of=lambda name: tuple(get(name).shape))


def _near(name: str, names) -> str:
    """A hint listing stored names that share the missing name's last component."""
    tail = name.rsplit(".", 2)[-2:]
    similar = sorted(n for n in names if n.endswith(".".join(tail)))[:3]
    return f"(similar names present: {similar})" if similar else ""


def weights_from_checkpoint(directory: str | Path, config: LlamaConfig, *, dtype: torch.dtype,
                            device: torch.device | str) -> LlamaWeights:
    """Weights from a ``save_pretrained`` directory of safetensors files, sharded or not."""
    try:
        from safetensors import safe_open
    except ImportError as exc:  # pragma: no cover - safetensors is a declared extra
        raise ImportError("loading checkpoints needs safetensors: pip install 'fusekit[hf]'") from exc
    directory = Path(directory)
    index_path = directory / SAFETENSORS_INDEX
    single = directory / SAFETENSORS_FILE
    if index_path.is_file():
        file_of = _read_shard_index(index_path)
    elif single.is_file():
        file_of = None
    else:
        raise FileNotFoundError(
            f"no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX} in checkpoint directory {directory}"
        )

    handles: dict[Path, object] = {}

    def open_file(path: Path, name: str):
        if path not in handles:
            if not path.is_file():
                raise FileNotFoundError(f"checkpoint file {path} (holding tensor {name!r}) does not exist")
            try:
                handles[path] = safe_open(str(path), framework="pt", device="cpu")
            except Exception as exc:  # safetensors raises its own error types for corrupt headers
                raise CheckpointError(f"checkpoint file {path} cannot be read (corrupt?): {exc}") from exc
        return handles[path]

    def where(name: str) -> str:
        return str(file_of.get(name, index_path) if file_of is not None else single)

    def handle_of(name: str):
        """The open file that holds tensor ``name`` (a CheckpointError naming file and tensor if none)."""
        if file_of is not None and name not in file_of:
            raise CheckpointError(f"tensor {name!r} is missing from shard index {index_path} {_near(name, file_of)}")
        path = single if file_of is None else file_of[name]
        handle = open_file(path, name)
        if name not in handle.keys():
            raise CheckpointError(f"tensor {name!r} is missing from checkpoint file {path} "
                                  f"{_near(name, handle.keys())}")
        return handle

    def read(name: str, what: Callable):
        handle = handle_of(name)
        try:
            return what(handle)
        except Exception as exc:  # safetensors' own error types: a corrupt file
            raise CheckpointError(f"tensor {name!r} in checkpoint file {where(name)} cannot be read (corrupt?): "
                                  f"{exc}") from exc

    def get(name: str) -> torch.Tensor:
        return read(name, lambda handle: handle.get_tensor(name))

    def shape_of(name: str) -> tuple[int, ...]:
        return read(name, lambda handle: tuple(handle.get_slice(name).get_shape()))

    stored = file_of if file_of is not None else open_file(single, "model.embed_tokens.weight").keys()
    return assemble_weights(config, get, dtype=dtype, device=device, where=where, names=stored, shape_of=shape_of)


def _read_shard_index(index_path: Path) -> dict[str, Path]:
    """Tensor name -> shard file of a ``model.safetensors.index.json``, every entry checked."""
    try:
        weight_map = json.loads(index_path.read_bytes())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"shard index {index_path} is not a valid safetensors index: {exc!r}") from exc
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"shard index {index_path}: 'weight_map' must map tensor names to file names, "
                              f"got {type(weight_map).__name__}")
    directory = index_path.parent
    file_of = {}
    for name, fname in weight_map.items():
        if not isinstance(fname, str) or Path(fname).name != fname or fname in ("", ".", ".."):
            raise CheckpointError(f"shard index {index_path}: tensor {name!r} maps to {fname!r}, "
                                  "expected the name of a file in the checkpoint directory")
        file_of[name] = directory / fname
    return file_of


def _check_unexpected(config: LlamaConfig, names: Iterable[str], expected: dict[str, tuple[int, ...]],
                      where: Callable[[str], str]) -> None:
    """A parameter of the decoder (``model.*``) that this config has no place for is refused: a bias the
    config does not declare (a Qwen2 checkpoint under a Llama config, ``mlp_bias``) would otherwise be dropped
    and the model would generate wrong tokens.  RoPE's stored ``inv_freq`` buffers (older checkpoints) are
    recomputed from the config and may be present."""
    for name in names:
        if name.startswith("model.") and name not in expected and not name.endswith("rotary_emb.inv_freq"):
            raise CheckpointError(
                f"tensor {name!r} in {where(name)} has no place in a {config.model_type!r} model of this config "
                f"(attention_bias={config.attention_bias}); check the config's 'model_type' and 'architectures'"
            )


def _check_layer_count(config: LlamaConfig, names: Iterable[str], where: Callable[[str], str]) -> None:
    """The decoder layers stored must be those of the config: more are refused (not silently
    dropped), fewer are named before anything is allocated for the config's layer count."""
    layers = set()
    for name in names:
        parts = name.split(".")
        if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
            layers.add(int(parts[2]))
            if int(parts[2]) >= config.num_hidden_layers:
                raise CheckpointError(
                    f"tensor {name!r} in {where(name)} belongs to layer {parts[2]}, but the config has "
                    f"num_hidden_layers = {config.num_hidden_layers}"
                )
    missing = min(set(range(min(config.num_hidden_layers, len(layers) + 1))) - layers, default=None)
    if missing is not None:
        name = f"model.layers.{missing}.input_layernorm.weight"
        raise CheckpointError(f"tensor {name!r} is missing: the checkpoint holds no tensor of layer {missing}, "
                              f"but the config has num_hidden_layers = {config.num_hidden_layers}")
