"""Fuzzing the checkpoint readers (issue 8): every corruption of config.json, of a safetensors
file's header or bytes, or of a shard index gives a clean exception (a ValueError, TypeError or
FileNotFoundError naming what is wrong) — never a crash, a hang or silently different weights."""

import json
import math
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_testing import tiny_hf_model

import llmfuse
from llmfuse.config import LlamaConfig
from llmfuse.weights import CheckpointError, weights_from_checkpoint

safetensors_torch = pytest.importorskip("safetensors.torch")

CLEAN = (ValueError, TypeError, FileNotFoundError)  # CheckpointError is a ValueError
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Which Hugging Face tensors feed each LlamaWeights field (to explain a changed field).
SOURCES = {"embed": ("embed_tokens",), "wqkv": ("q_proj", "k_proj", "v_proj"), "wo": ("o_proj",),
           "attn_norm": ("input_layernorm",), "w_gate_up": ("gate_proj", "up_proj"), "w_down": ("down_proj",),
           "mlp_norm": ("post_attention_layernorm",), "final_norm": ("model.norm.",), "lm_head": ("lm_head",)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved tiny model: its directory, file bytes, config, weights and each tensor's byte range."""
    directory = tmp_path_factory.mktemp("ckpt")
    tiny_hf_model().save_pretrained(directory)
    data = (directory / "model.safetensors").read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_len])
    ranges = {name: (8 + header_len + start, 8 + header_len + stop)
              for name, entry in header.items() if name != "__metadata__"
              for start, stop in [entry["data_offsets"]]}
    config = LlamaConfig.from_json(directory / "config.json")
    weights = weights_from_checkpoint(directory, config, dtype=torch.float32, device="cpu")
    return {"dir": directory, "bytes": data, "header_end": 8 + header_len, "ranges": ranges, "config": config,
            "weights": weights}


def _load_mutated(checkpoint, data: bytes, config_text: str | None = None):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "config.json").write_text(config_text or (checkpoint["dir"] / "config.json").read_text())
        (tmp / "model.safetensors").write_bytes(data)
        return llmfuse.from_pretrained(tmp, device="cpu", dtype=torch.float32, max_seq_len=8)


@FUZZ
@given(edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
       in_header=st.booleans())
def test_safetensors_byte_corruption_is_refused_or_confined_to_the_bytes_hit(checkpoint, edits, in_header):
    """Bytes overwritten anywhere (half the time inside the header): the load either raises a clean
    exception or yields weights that differ from the original only in tensors whose data bytes
    were overwritten (safetensors has no checksum: a changed float stays a float)."""
    data = bytearray(checkpoint["bytes"])
    span = checkpoint["header_end"] if in_header else len(data)
    offsets = [int(where * span) for where, _ in edits]
    for offset, (_, value) in zip(offsets, edits):
        data[offset] = value
    try:
        model = _load_mutated(checkpoint, bytes(data))
    except CLEAN:
        return
    hit = {name for name, (lo, hi) in checkpoint["ranges"].items()
           if any(lo <= off < hi and data[off] != checkpoint["bytes"][off] for off in offsets)}
    for field, sources in SOURCES.items():
        if not torch.equal(getattr(model.weights, field), getattr(checkpoint["weights"], field)):
            assert any(s in name for name in hit for s in sources), f"{field} changed without its bytes being hit"


@FUZZ
@given(keep=st.floats(0, 1, exclude_max=True))
def test_truncated_safetensors_file_is_refused(checkpoint, keep):
    data = checkpoint["bytes"][: int(keep * len(checkpoint["bytes"]))]
    with pytest.raises(CLEAN):
        _load_mutated(checkpoint, data)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=6)


@FUZZ
@given(name=st.sampled_from(["model.norm.weight", "model.layers.0.self_attn.q_proj.weight", "__metadata__"]),
       key=st.sampled_from(["dtype", "shape", "data_offsets", None]), value=JSON)
def test_safetensors_header_entries_replaced_are_refused_or_harmless(checkpoint, name, key, value):
    """A header entry (or one field of it) replaced by arbitrary JSON: a clean exception, or (metadata
    only) the original weights."""
    data = checkpoint["bytes"]
    header = json.loads(data[8:checkpoint["header_end"]])
    if key is None or not isinstance(header[name], dict):
        header[name] = value
    else:
        header[name][key] = value
    text = json.dumps(header).encode()
    try:
        model = _load_mutated(checkpoint, struct.pack("<Q", len(text)) + text + data[checkpoint["header_end"]:])
    except CLEAN:
        return
    for field in SOURCES:
        assert torch.equal(getattr(model.weights, field), getattr(checkpoint["weights"], field)), field


def _valid_config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97, "hidden_size": 48,
            "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
            "head_dim": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 128,
            "eos_token_id": 1, "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16}}


FIELDS = sorted(_valid_config()) + ["hidden_act", "rope_parameters", "sliding_window", "attention_bias", "mlp_bias"]


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), JSON | st.just("<delete>")), min_size=1, max_size=3))
def test_config_fields_fuzzed_are_refused_or_valid(changes):
    """Any field set to any JSON value (or deleted): a ValueError/TypeError naming a field, or a config
    the decoder can run (sizes >= 1, heads grouped evenly, finite positive eps and RoPE frequencies)."""
    cfg = _valid_config()
    for name, value in changes:
        if value == "<delete>":
            cfg.pop(name, None)
        else:
            cfg[name] = value
    try:
        config = LlamaConfig.from_dict(cfg, source="fuzzed config")
    except CLEAN as exc:
        assert "field" in str(exc) or "config" in str(exc), exc
        return
    _assert_runnable(config)


def _assert_runnable(config: LlamaConfig) -> None:
    """A config that parsed is one the decoder can run: sizes >= 1, heads grouped evenly, finite positive
    eps and RoPE frequencies, end-of-sequence ids inside the vocabulary."""
    sizes = (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
             config.num_key_value_heads, config.head_dim, config.max_position_embeddings)
    assert all(isinstance(n, int) and n >= 1 for n in sizes)
    assert config.num_attention_heads % config.num_key_value_heads == 0 and config.head_dim % 2 == 0
    assert math.isfinite(config.rms_norm_eps) and config.rms_norm_eps > 0
    inv_freq = config.rope_inv_freq()
    assert bool(torch.isfinite(inv_freq).all()) and bool((inv_freq > 0).all())
    assert all(0 <= e < config.vocab_size for e in config.eos_token_id)


@FUZZ
@given(edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=3))
def test_config_json_bytes_corrupted_are_refused_or_parsed(checkpoint, edits):
    text = bytearray((checkpoint["dir"] / "config.json").read_bytes())
    for where, value in edits:
        text[int(where * len(text))] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_bytes(bytes(text))
        try:
            config = LlamaConfig.from_json(path)
        except CLEAN as exc:
            assert "config" in str(exc) or "field" in str(exc) or "JSON" in str(exc), exc
            return
        _assert_runnable(config)  # the corruption left a valid config: it must be one the decoder can run


@FUZZ
@given(weight_map=JSON)
def test_shard_index_fuzzed_is_refused(checkpoint, weight_map):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "config.json").write_text((checkpoint["dir"] / "config.json").read_text())
        (tmp / "model-00001-of-00001.safetensors").write_bytes(checkpoint["bytes"])
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(CLEAN):
            llmfuse.from_pretrained(tmp, device="cpu", dtype=torch.float32)


def test_layer_count_and_non_finite_weights_are_named(checkpoint, tmp_path):
    """A config with fewer or more layers than the checkpoint, and a NaN in a tensor."""
    cfg = json.loads((checkpoint["dir"] / "config.json").read_text())
    for layers, message in ((1, "belongs to layer 1.*num_hidden_layers = 1"),
                            (10**9, "layers.2.*missing.*num_hidden_layers = 1000000000")):
        with pytest.raises(CheckpointError, match=message):
            _load_mutated(checkpoint, checkpoint["bytes"], json.dumps({**cfg, "num_hidden_layers": layers}))
    tensors = safetensors_torch.load(checkpoint["bytes"])
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    with pytest.raises(CheckpointError, match=r"down_proj.*model.safetensors.*NaN"):
        _load_mutated(checkpoint, safetensors_torch.save(tensors, metadata={"format": "pt"}))
