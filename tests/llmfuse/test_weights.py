"""Config parsing and checkpoint loading: save_pretrained directories, sharded and not, and
every way a checkpoint can be wrong (each error names the file and the tensor)."""

import json

import pytest
import torch
from llm_testing import LLAMA3_ROPE, tiny_hf_model

import llmfuse
from fusecore.testing import test_device
from llmfuse.config import LlamaConfig
from llmfuse.weights import CheckpointError, weights_from_hf_model

safetensors_torch = pytest.importorskip("safetensors.torch")


def _llama_dict(**changes):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97, "hidden_size": 48,
           "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2}
    cfg.update(changes)
    return cfg


def test_config_reads_llama3_rope_scaling_like_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = tiny_hf_model(rope_scaling=LLAMA3_ROPE)
    cfg = LlamaConfig.from_hf(model.config)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    assert torch.equal(cfg.rope_inv_freq(), expected)
    assert cfg.group_size == 3 and cfg.head_dim == 8 and not cfg.tie_word_embeddings
    # the pre-transformers-5 spelling of the same config
    old = LlamaConfig.from_dict(_llama_dict(head_dim=8, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE))
    assert torch.equal(old.rope_inv_freq(), expected)


@pytest.mark.parametrize("field, value", [
    ("architectures", ["GPT2LMHeadModel"]),
    ("model_type", "gpt2"),
    ("hidden_act", "gelu"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("num_key_value_heads", 4),
    ("attention_bias", True),
])
def test_unsupported_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LlamaConfig.from_dict(_llama_dict(**{field: value}))


def test_mistral_sliding_window_is_refused_by_name():
    cfg = _llama_dict(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096)
    with pytest.raises(ValueError, match="sliding_window"):
        LlamaConfig.from_dict(cfg)


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_checkpoint_loads_like_the_model(tmp_path, shard):
    model = tiny_hf_model(tied=shard is None)
    if shard:
        model.save_pretrained(tmp_path, max_shard_size=shard)
        assert (tmp_path / "model.safetensors.index.json").is_file()
    else:
        model.save_pretrained(tmp_path)
    # on the device the kernels run on: compiled, a model on the CPU is refused at load
    loaded = llmfuse.from_pretrained(tmp_path, device=test_device(), dtype=torch.float32)
    direct = weights_from_hf_model(model, loaded.config, dtype=torch.float32, device=test_device())
    for name in ("embed", "wqkv", "wo", "attn_norm", "w_gate_up", "w_down", "mlp_norm", "final_norm", "lm_head"):
        assert torch.equal(getattr(loaded.weights, name), getattr(direct, name)), name
    assert (loaded.weights.lm_head.data_ptr() == loaded.weights.embed.data_ptr()) == (shard is None)


def _rewrite(path, change):
    tensors = safetensors_torch.load_file(path)
    change(tensors)
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})


def test_checkpoint_errors_name_file_and_tensor(tmp_path):
    model = tiny_hf_model()
    model.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    name = "model.layers.1.mlp.up_proj.weight"

    _rewrite(file, lambda t: t.update({name: t[name][:, :-1].contiguous()}))
    with pytest.raises(CheckpointError, match=rf"{name}.*model.safetensors.*shape \(88, 47\)"):
        llmfuse.from_pretrained(tmp_path, device="cpu")

    _rewrite(file, lambda t: t.update({name: torch.zeros(88, 48, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match=rf"{name}.*model.safetensors.*dtype torch.int32, expected a float"):
        llmfuse.from_pretrained(tmp_path, device="cpu")

    _rewrite(file, lambda t: t.update({"model.layers.1.mlp.upproj.weight": t.pop(name)}))
    with pytest.raises(CheckpointError, match=rf"{name}.*missing.*model.safetensors"):
        llmfuse.from_pretrained(tmp_path, device="cpu")

    file.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(CheckpointError, match="model.safetensors.*corrupt"):
        llmfuse.from_pretrained(tmp_path, device="cpu")

    file.unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        llmfuse.from_pretrained(tmp_path, device="cpu")


def test_missing_shard_and_bad_config_are_named(tmp_path):
    model = tiny_hf_model()
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.norm.weight"]
    (tmp_path / shard).unlink()
    with pytest.raises(FileNotFoundError, match=rf"{shard} \(holding tensor 'model\."):
        llmfuse.from_pretrained(tmp_path, device="cpu")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["BertModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="architectures"):
        llmfuse.from_pretrained(tmp_path, device="cpu")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        llmfuse.from_pretrained(tmp_path / "nowhere", device="cpu")
