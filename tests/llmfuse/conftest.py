"""Fixtures of the llmfuse tests: tiny random transformers models (see llm_testing)."""

import pytest
from llm_testing import LLAMA3_ROPE, tiny_hf_model


@pytest.fixture(scope="module")
def hf_llama():
    """Untied, GQA (6 query / 2 KV heads), llama3 RoPE scaling."""
    return tiny_hf_model(rope_scaling=LLAMA3_ROPE)


@pytest.fixture(scope="module")
def hf_llama_tied():
    """Tied embeddings, 3 KV heads, default RoPE."""
    return tiny_hf_model(tied=True, kv_heads=3, seed=1)
