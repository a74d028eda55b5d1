"""examples/generate.py streams the same tokens as LlamaModel.generate from a saved checkpoint."""

import importlib.util
from pathlib import Path

import torch
from llm_testing import tiny_hf_model

import llmfuse

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "generate.py"


def test_generate_example_streams_token_ids(tmp_path, capsys):
    tiny_hf_model(seed=4).save_pretrained(tmp_path)
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main([str(tmp_path), "--ids", "5,6,7", "--new", "5"]) == 0
    streamed = [int(tok) for tok in capsys.readouterr().out.split()]
    model = llmfuse.from_pretrained(tmp_path)
    expected = model.generate(torch.tensor([[5, 6, 7]], device=model.device), 5, eos_token_id=1)
    assert streamed == expected[0, 3:].tolist()


def test_generate_example_reports_a_bad_checkpoint(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    assert example.main([str(tmp_path), "--ids", "5,6"]) == 2
    assert "architectures" in capsys.readouterr().err


def test_generate_example_reports_bad_settings(tmp_path, capsys):
    """A bad prompt id or setting is reported in one line (exit status 2), as a bad checkpoint is."""
    tiny_hf_model(seed=4, layers=1).save_pretrained(tmp_path)
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    cases = ((["--ids", "5,6,99"], "token id 99"), (["--ids", "5", "--new", "-1"], "max_new_tokens"),
             (["--ids", "5", "--temperature", "-1"], "temperature"), (["--ids", "5", "--seed", "-3"], "seed"))
    for args, message in cases:
        assert example.main([str(tmp_path), *args]) == 2
        assert message in capsys.readouterr().err
