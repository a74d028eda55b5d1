"""Tiny random Llama models with odd sizes, shared by the llmfuse tests (nothing is downloaded)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def tiny_hf_model(*, tied: bool = False, kv_heads: int = 2, rope_scaling: dict | None = None, seed: int = 0,
                  layers: int = 2, std: float = 0.15, arch: str = "llama"):
    """A LlamaForCausalLM (or Qwen2/Mistral) with vocab 97, hidden 48, 6 query heads of dim 8, MLP 88.

    Weights are drawn with a larger std than HF's init so that greedy tokens vary and logits
    differ clearly between tokens.
    """
    kwargs = dict(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=layers,
                  num_attention_heads=6, num_key_value_heads=kv_heads, head_dim=8, max_position_embeddings=128,
                  tie_word_embeddings=tied, rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if arch == "llama":
        kwargs.update(rope_theta=500000.0)
        if rope_scaling is not None:
            kwargs["rope_scaling"] = {**rope_scaling}
        config, cls = transformers.LlamaConfig(**kwargs), transformers.LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = transformers.Qwen2Config(**kwargs, use_sliding_window=False), transformers.Qwen2ForCausalLM
    else:
        config, cls = transformers.MistralConfig(**kwargs, sliding_window=None), transformers.MistralForCausalLM
    torch.manual_seed(seed)
    model = cls(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model
