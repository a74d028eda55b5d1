"""The whole engine against transformers' LlamaForCausalLM on the same random weights:
logits, ≥ 32 greedy tokens identical (GQA, llama3 RoPE scaling, tied and untied, ragged
left-padded batches), sampling, and the errors a user can cause."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_testing import tiny_hf_model, transformers

import llmfuse
from fusecore import use_reference
from fusecore.testing import assert_close, test_device

NEW_TOKENS = 32


def _hf_greedy(model, ids, mask, new):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                              eos_token_id=None)


@pytest.mark.parametrize("looped", [False, True])
def test_greedy_tokens_match_transformers(hf_llama, looped):
    """Untied, GQA 6/2, llama3 RoPE; a ragged batch: row 0 left-padded by 3."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 97, (2, 6), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    expected = _hf_greedy(hf_llama, ids, mask, NEW_TOKENS)
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=6 + NEW_TOKENS, looped=looped)
    out = model.generate(ids.to(test_device()), NEW_TOKENS, attention_mask=mask)
    assert out.dtype == torch.int64 and out.shape == (2, 6 + NEW_TOKENS)
    assert torch.equal(out.cpu(), expected)
    assert len(set(out[1, 6:].tolist())) > 3  # the test model does not collapse onto one token


def test_decode_logits_match_transformers_tied(hf_llama_tied):
    """Tied embeddings, GQA 6/3, default RoPE, batch 1: prefill + 3 fused steps vs HF logits."""
    ids = torch.tensor([[5, 17, 33, 2, 90]])
    model = llmfuse.from_pretrained(hf_llama_tied, dtype=torch.float32, max_seq_len=12)
    seq = ids.clone()
    logits = model.prefill(ids.to(test_device()))
    for _ in range(3):
        with torch.no_grad():
            expected = hf_llama_tied(seq).logits[:, -1]
        assert_close(logits.cpu(), expected, torch.float32, name=f"logits at length {seq.shape[1]}")
        token = expected.argmax(-1)
        seq = torch.cat([seq, token[:, None]], 1)
        logits = model.decode_step(token.to(test_device()))


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_qwen2_and_mistral_architectures(arch):
    hf = tiny_hf_model(arch=arch, layers=1, seed=3)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    expected = _hf_greedy(hf, ids, torch.ones_like(ids), 8)
    model = llmfuse.from_pretrained(hf, dtype=torch.float32, max_seq_len=16)
    assert torch.equal(model.generate(ids.to(test_device()), 8).cpu(), expected)


def test_reference_path_and_batch_of_one_row_equal_fused(hf_llama):
    ids = torch.tensor([[9, 8, 7, 6]])
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=16)
    fused = model.generate(ids.to(test_device()), 6)
    with use_reference():
        unfused = model.generate(ids.to(test_device()), 6)
    assert torch.equal(fused, unfused)


def test_fused_sampling_is_seeded_and_matches_the_reference_path(hf_llama):
    ids = torch.tensor([[11, 12, 13], [14, 15, 16]]).to(test_device())
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=12)
    a = model.generate(ids, 6, temperature=0.9, seed=123)
    assert torch.equal(a, model.generate(ids, 6, temperature=0.9, seed=123))
    assert not torch.equal(a, model.generate(ids, 6, temperature=0.9, seed=124))
    with use_reference():
        assert torch.equal(a, model.generate(ids, 6, temperature=0.9, seed=123))
    with pytest.raises(ValueError, match="seed"):
        model.generate(ids, 2, temperature=0.9, seed=-1)


def test_sampling_is_seeded_and_top_k_one_is_greedy(hf_llama):
    ids = torch.tensor([[11, 12, 13], [14, 15, 16]]).to(test_device())
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=12)
    a = model.generate(ids, 5, temperature=0.8, top_p=0.9, seed=123)
    b = model.generate(ids, 5, temperature=0.8, top_p=0.9, seed=123)
    assert torch.equal(a, b)
    assert torch.equal(model.generate(ids, 5, temperature=1.3, top_k=1, seed=5), model.generate(ids, 5))


def test_sample_tokens_respects_top_k_and_top_p():
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0, -9.0]]).repeat(200, 1)
    gen = torch.Generator().manual_seed(0)
    assert set(llmfuse.sample_tokens(logits, 1.0, 2, None, gen).tolist()) <= {0, 1}
    assert set(llmfuse.sample_tokens(logits, 1.0, None, 0.5, gen).tolist()) == {0}


def test_eos_pads_finished_rows_and_stops(hf_llama):
    ids = torch.tensor([[20, 21, 22]]).to(test_device())
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=40)
    free = model.generate(ids, 8)
    eos = int(free[0, 5])  # the third new token
    out = model.generate(ids, 8, eos_token_id=eos)
    assert out.shape[1] == 6 and int(out[0, -1]) == eos


def test_user_errors_are_clear(hf_llama):
    """Every mistake raises before anything runs, and the model keeps working afterwards."""
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=8)
    dev = test_device()
    prompt = torch.tensor([[4, 5, 6]], device=dev)
    before = model.generate(prompt, 2)
    with pytest.raises(ValueError, match="token id 97.*vocabulary"):
        model.generate(torch.tensor([[1, 97]], device=dev), 2)
    with pytest.raises(ValueError, match="token id -1"):
        model.generate(torch.tensor([[-1, 3]], device=dev), 2)
    with pytest.raises(ValueError, match="longer than the cache"):
        model.prefill(torch.ones(1, 9, dtype=torch.int64, device=dev))
    with pytest.raises(ValueError, match="exceeds the cache"):
        model.generate(torch.ones(1, 5, dtype=torch.int64, device=dev), 4)
    with pytest.raises(TypeError, match="input_ids has dtype float32; expected one of int64, int32"):
        model.generate(torch.ones(1, 5, device=dev), 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.ones(1, 5, dtype=torch.int64, device=dev), -1)
    with pytest.raises(ValueError, match="left-padded"):
        model.generate(torch.ones(1, 3, dtype=torch.int64, device=dev), 1, attention_mask=torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="prefill"):
        llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=8).decode_step(
            torch.tensor([1], device=dev))
    model.prefill(torch.ones(1, 7, dtype=torch.int64, device=dev))
    model.decode_step(torch.tensor([3], device=dev))
    with pytest.raises(ValueError, match="cache is full"):
        model.decode_step(torch.tensor([3], device=dev))
    with pytest.raises(TypeError, match="dtype"):
        llmfuse.from_pretrained(hf_llama, dtype=torch.int8)
    for bad in (97, -1, [1, "2"], "1", 1.0):  # ([] is allowed: never stop)
        with pytest.raises(ValueError, match="eos_token_id"):
            model.generate(prompt, 2, eos_token_id=bad)
    for bad in (float("nan"), float("inf"), -0.5):
        with pytest.raises(ValueError, match="temperature"):
            model.generate(prompt, 2, temperature=bad)
    with pytest.raises(ValueError, match="only 0 and 1"):
        model.generate(prompt, 1, attention_mask=torch.tensor([[0.5, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="2 dimensions"):
        model.generate(prompt[0], 1)
    assert torch.equal(model.generate(prompt, 2), before)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 4), prompt=st.integers(1, 5), new=st.integers(1, 3), data=st.data())
def test_any_batch_and_prompt_length_generate_like_the_reference_path(hf_llama, batch, prompt, new, data):
    """Property over batch sizes, prompt lengths and left paddings: the fused steps produce the
    tokens of the unfused reference path (float32, greedy)."""
    pads = data.draw(st.lists(st.integers(0, prompt - 1), min_size=batch, max_size=batch), label="left pads")
    ids = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 96), min_size=prompt, max_size=prompt),
                                          min_size=batch, max_size=batch), label="ids"), device=test_device())
    mask = (torch.arange(prompt)[None, :] >= torch.tensor(pads)[:, None]).to(torch.int64)
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=prompt + new)
    fused = model.generate(ids, new, attention_mask=mask)
    with use_reference():
        unfused = model.generate(ids, new, attention_mask=mask)
    assert fused.shape == (batch, prompt + new)
    assert torch.equal(fused, unfused)


@pytest.mark.gpu
@pytest.mark.parametrize("looped", [False, True])
def test_gpu_seeded_sampling_is_identical_run_to_run(hf_llama, looped):
    """Issue 8 determinism on the GPU: the same seed gives the same tokens, fused (temperature only)
    and host-sampled (top-p), at batch 5 in bf16 under CUDA graphs."""
    ids = torch.randint(3, 97, (5, 6), generator=torch.Generator().manual_seed(4)).cuda()
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.bfloat16, max_seq_len=40, looped=looped)
    for kwargs in ({"temperature": 0.8}, {"temperature": 0.8, "top_p": 0.9}):
        runs = [model.generate(ids, 24, seed=11, **kwargs) for _ in range(2)]
        assert torch.equal(runs[0], runs[1]), kwargs
        assert not torch.equal(runs[0], model.generate(ids, 24, seed=12, **kwargs)), kwargs


@pytest.mark.gpu
@pytest.mark.parametrize("looped", [False, True])
def test_gpu_cuda_graph_generation_equals_eager_launches(hf_llama, looped):
    ids = torch.randint(3, 97, (3, 7), generator=torch.Generator().manual_seed(2)).cuda()
    graphed = llmfuse.from_pretrained(hf_llama, dtype=torch.bfloat16, max_seq_len=64, looped=looped, cuda_graph=True)
    eager = llmfuse.from_pretrained(hf_llama, dtype=torch.bfloat16, max_seq_len=64, looped=looped, cuda_graph=False)
    assert torch.equal(graphed.generate(ids, 40), eager.generate(ids, 40))
    logits = graphed.decode_step(torch.tensor([1, 2, 3], device="cuda"))
    assert torch.equal(logits, eager.decode_step(torch.tensor([1, 2, 3], device="cuda")))


def test_generation_defaults_follow_the_checkpoint_as_transformers(tmp_path):
    """Session 38's audit.  generate() stops at the model's end-of-sequence ids by default (config.json's, or
    generation_config.json's where the checkpoint has one: transformers' defaults), pads finished rows with
    pad_token_id, and ``eos_token_id=[]`` never stops."""
    hf = tiny_hf_model(seed=5, layers=1)
    ids = torch.tensor([[20, 21, 22]])
    model = llmfuse.from_pretrained(hf, dtype=torch.float32, max_seq_len=16)
    free = model.generate(ids.to(test_device()), 8, eos_token_id=[])
    assert free.shape == (1, 11)
    stop = int(free[0, 5])  # the third new token, as the model's end-of-sequence id
    hf.config.eos_token_id = hf.generation_config.eos_token_id = stop
    hf.generation_config.pad_token_id = 0
    hf.save_pretrained(tmp_path)
    saved = llmfuse.from_pretrained(tmp_path, dtype=torch.float32, max_seq_len=16)
    assert saved.eos_token_id == (stop,) and saved.pad_token_id == 0
    out = saved.generate(ids.to(test_device()), 8)
    assert out.shape[1] == 6 and int(out[0, -1]) == stop  # stopped where transformers stops
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(out.cpu(), expected)
    # a batch whose first row finishes first: later positions hold pad_token_id, as transformers writes them
    batch = torch.tensor([[20, 21, 22], [7, 8, 9]])
    rows = saved.generate(batch.to(test_device()), 8, pad_token_id=3)
    first_end = int((rows[0, 3:] == stop).nonzero()[0])
    assert (rows[0, 3 + first_end + 1:] == 3).all()
    # the end-of-turn id only generation_config.json names is the one generate stops at
    (tmp_path / "generation_config.json").write_text(f'{{"eos_token_id": [{stop}], "pad_token_id": 5}}')
    cfg = (tmp_path / "config.json").read_text().replace(f'"eos_token_id": {stop}', '"eos_token_id": 1')
    (tmp_path / "config.json").write_text(cfg)
    again = llmfuse.from_pretrained(tmp_path, dtype=torch.float32, max_seq_len=16)
    assert again.eos_token_id == (stop,) and again.pad_token_id == 5
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="generation_config.json"):
        llmfuse.from_pretrained(tmp_path, dtype=torch.float32)


def test_more_user_errors_are_clear(hf_llama):
    """Session 38's audit: each of these once failed late, silently or with an internal message."""
    import numpy as np

    dev = test_device()
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=8)
    prompt = torch.tensor([[4, 5, 6]], device=dev)
    before = model.generate(prompt, 2)
    with pytest.raises(ValueError, match="temperature must be 0"):  # 1/temperature overflows float32
        model.generate(prompt, 2, temperature=1e-40)
    model.prefill(prompt)
    with pytest.raises(ValueError, match="input_ids must hold at least one row"):
        model.generate(torch.zeros(0, 3, dtype=torch.int64, device=dev), 1)
    assert model.batch == 1 and model.position == 3  # the prefill's state is kept
    model.decode_step(torch.tensor([4], device=dev))
    with pytest.raises(ValueError, match="max_seq_len must be an int >= 1, got 0"):
        llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=0)
    with pytest.raises(ValueError, match="temperature"):  # checked when stream() is called, not at next()
        model.stream(prompt, 2, temperature=-1)
    # numpy integers are integers
    assert torch.equal(model.generate(prompt, np.int64(2), seed=np.int64(3)), before)
    with pytest.raises(ValueError, match="pad_token_id"):
        model.generate(prompt, 2, pad_token_id=97)


def test_checkpoint_family_and_unexpected_tensors_are_checked(tmp_path):
    """A Qwen2 checkpoint without 'model_type' is a Qwen2 model (its Q/K/V biases used); one whose 'model_type'
    contradicts its architecture is refused; a bias the config has no place for is refused, not dropped."""
    import json

    hf = tiny_hf_model(arch="qwen2", layers=1, seed=3)
    hf.save_pretrained(tmp_path)
    ids = torch.tensor([[4, 8, 15, 16]])
    expected = _hf_greedy(hf, ids, torch.ones_like(ids), 4)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = llmfuse.from_pretrained(tmp_path, dtype=torch.float32, max_seq_len=12)
    assert model.config.attention_bias
    assert torch.equal(model.generate(ids.to(test_device()), 4, eos_token_id=[]).cpu(), expected)
    config["model_type"] = "llama"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'model_type' = 'llama' contradicts field 'architectures'"):
        llmfuse.from_pretrained(tmp_path, dtype=torch.float32)
    config["architectures"] = ["LlamaForCausalLM"]  # a Llama config over a checkpoint with biases
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.[qkv]_proj\.bias'.*no place"):
        llmfuse.from_pretrained(tmp_path, dtype=torch.float32)


def test_pad_token_id_comes_from_config_json_without_generation_config(tmp_path):
    """Without generation_config.json, transformers pads finished rows with config.json's pad_token_id, not eos."""
    import json

    hf = tiny_hf_model(seed=5, layers=1)
    ids = torch.tensor([[20, 21, 22], [7, 8, 9]])
    with torch.no_grad():
        free = hf.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    stop = int(free[0, 4])  # row 0 stops at its second new token, row 1 runs on
    assert stop not in free[1, 3:].tolist()
    hf.config.eos_token_id, hf.config.pad_token_id = stop, 5
    hf.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = loaded.generate(ids, max_new_tokens=8, do_sample=False)
    model = llmfuse.from_pretrained(tmp_path, dtype=torch.float32, max_seq_len=16)
    assert model.pad_token_id == 5
    assert torch.equal(model.generate(ids.to(test_device()), 8).cpu(), expected)
    config = json.loads((tmp_path / "config.json").read_text())
    config["pad_token_id"] = -1  # old conversions: not a token; finished rows then hold the first eos id
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert llmfuse.from_pretrained(tmp_path, dtype=torch.float32, max_seq_len=16).pad_token_id is None


def test_attention_mask_is_checked_at_the_call(hf_llama):
    """stream() checks attention_mask when called (not at the first next()), and so does generate(..., 0)."""
    model = llmfuse.from_pretrained(hf_llama, dtype=torch.float32, max_seq_len=8)
    prompt = torch.tensor([[4, 5, 6]], device=test_device())
    for bad in (torch.tensor([[1, 1]]), torch.tensor([[1, 0, 1]]), torch.tensor([[0, 0, 0]])):
        with pytest.raises(ValueError, match="attention_mask"):
            model.stream(prompt, 2, attention_mask=bad)
        with pytest.raises(ValueError, match="attention_mask"):
            model.generate(prompt, 0, attention_mask=bad)
    assert torch.equal(model.generate(prompt, 0, attention_mask=torch.ones(1, 3)), prompt)
