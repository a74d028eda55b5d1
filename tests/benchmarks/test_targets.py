"""The gnnfuse and llmfuse targets tables: generated from the committed records, ratios and marks as TARGETS.md
sets them."""

from benchmarks import targets
from fusecore.report import Record, write_jsonl


def _row(case: str, implementation: str, ms: float, domain: str = "gnn", **extra) -> Record:
    env = {"commit": "abc1234", "date": "2026-11-28T10:00:00+00:00"}
    return Record(domain=domain, case=case, implementation=implementation, median_ms=ms, p20_ms=ms, p80_ms=ms,
                  gpu_time=True, method="do_bench", env=env, **extra)


def test_the_readme_table_is_generated_from_the_committed_records():
    text = targets.render()
    assert text.startswith(targets.BEGIN) and text.endswith(targets.END)
    assert targets.main(["--check"]) == 0, "gnnfuse/README.md is stale: run python -m benchmarks.targets"


def test_ratios_marks_and_missing_rows(tmp_path):
    probe = {"host_probe_us": [1000.4, 640.0]}
    rows = [
        # GAT fp32 forward: 3.2x compiled (met), 12x eager (not met; replayed exactly 15x: met);
        # step 2x compiled, replayed 3.5x (met)
        _row("gatconv[arxiv-like,fp32,fwd]", "fused (gnnfuse)", 0.5, params=probe),
        _row("gatconv[arxiv-like,fp32,fwd]", "fused (gnnfuse), CUDA graph", 0.4),
        _row("gatconv[arxiv-like,fp32,fwd]", "PyG GATConv torch.compile", 1.6),
        _row("gatconv[arxiv-like,fp32,fwd]", "PyG GATConv eager", 6.0),
        _row("gatconv[arxiv-like,fp32,fwd+bwd]", "fused (gnnfuse)", 2.0),
        _row("gatconv[arxiv-like,fp32,fwd+bwd]", "fused (gnnfuse), CUDA graph", 4.0 / 3.5),
        _row("gatconv[arxiv-like,fp32,fwd+bwd]", "PyG GATConv torch.compile", 4.0),
        # breakdown rows and other graphs' rows do not enter the arxiv-like table
        _row("gatconv[arxiv-like,fp32,fwd,parts]", "fused (gnnfuse)", 0.01),
        _row("gatconv[cora,fp32,fwd]", "fused (gnnfuse)", 0.01),
        # AGNN bf16: no compiled PyG row in the run
        _row("agnnconv[arxiv-like,bf16,fwd]", "fused (gnnfuse)", 0.3),
        _row("agnnconv[arxiv-like,bf16,fwd]", "PyG AGNNConv eager", 6.0),
        # Reddit-scale: 60% of the floor (met), peak memory 1/5 (met) forward, 1/2 (not met) step
        _row("gatconv[reddit-scale,bf16,fwd]", "fused (gnnfuse)", 1.5, fraction_of_floor=0.6, peak_memory_bytes=20),
        _row("gatconv[reddit-scale,bf16,fwd]", "PyG GATConv eager", 30.0, peak_memory_bytes=100),
        _row("gatconv[reddit-scale,bf16,fwd+bwd]", "fused (gnnfuse)", 5.0, peak_memory_bytes=50),
        _row("gatconv[reddit-scale,bf16,fwd+bwd]", "PyG GATConv eager", 90.0, peak_memory_bytes=100),
        _row("gatv2conv[reddit-scale,fp32,fwd]", "fused (gnnfuse)", 3.0, fraction_of_floor=0.4),
    ]
    path = write_jsonl(rows, tmp_path / "gnn.jsonl", append=False)
    text = targets.render(path)
    lines = text.splitlines()
    gat = next(line for line in lines if line.startswith("| GAT fp32 |") and "ms;" in line)
    assert gat == ("| GAT fp32 | **3.20×** (0.500 ms; replayed 0.400, **4.00×**) | 12.00× (replayed **15.00×**) "
                   "| 2.00× (2.000 ms; replayed 1.143, **3.50×**) | 1000 / 640; - | abc1234, 2026-11-28 |")
    agnn = next(line for line in lines if line.startswith("| AGNN bf16 |"))
    assert agnn.startswith("| AGNN bf16 | - (0.300 ms) | **20.00×** | - |")
    assert not any(line.startswith(("| GATv2 fp32 | **", "| AGNN fp32 |")) and "ms;" in line for line in lines)
    reddit = [line for line in lines if line.startswith("| GAT bf16 | 1.500")]
    assert reddit == ["| GAT bf16 | 1.500 | **60.0%** | **0.200** / 0.500 | abc1234, 2026-11-28 |"]
    assert "| GATv2 fp32 | 3.000 | 40.0% | - / - | abc1234, 2026-11-28 |" in lines


def test_llm_targets_from_the_decode_rows(tmp_path):
    def decode(model, batch, implementation, ms, floor=None):
        return _row(f"decode[{model},B={batch},ctx=512]", implementation, ms, "llm", fraction_of_floor=floor)

    per_layer, looped = "fused per-layer kernels (CUDA graph)", "looped kernel (CUDA graph)"
    rows = [
        decode("Llama-3.2-1B", 1, "HF transformers eager", 30.0),
        decode("Llama-3.2-1B", 1, "reference decoder torch.compile (CUDA graphs)", 1.4),
        decode("Llama-3.2-1B", 1, per_layer, 0.74, 0.78),
        decode("Llama-3.2-1B", 1, looped, 1.1),
        decode("Llama-3.2-1B", 8, per_layer, 1.2),
        decode("Llama-3.2-1B", 8, looped, 1.0),
        decode("Llama-3.1-8B", 1, per_layer, 4.4, 0.84),
        _row("plan_sweep[Llama-3.2-1B,B=1]", per_layer, 0.1, "llm"),  # other llm cases stay out
    ]
    path = write_jsonl(rows, tmp_path / "llm.jsonl", append=False)
    lines = targets.render_llm(path).splitlines()
    assert ("| Llama-3.2-1B batch 1 ≤ 0.75 ms | **0.7400 ms** (fused per-layer kernels (CUDA graph); 78.0% of the "
            "floor) | abc1234, 2026-11-28 |") in lines
    assert any(line.startswith("| the same ≥ 40× HF eager | **40.5×** against this run's 30.00 ms; against "
                               "TARGETS.md's 30.2 ms **40.8×** |") for line in lines)
    assert any(line.startswith("| the same ≥ 1.9× the compiled static-cache decoder | 1.89× (1.400 ms) |")
               for line in lines)
    assert any(line.startswith("| Llama-3.2-1B batch 8 ≤ 0.9 ms | 1.0000 ms (looped kernel (CUDA graph)) |")
               for line in lines)
    assert any(line.startswith("| Llama-3.1-8B batch 1 ≥ 85% of the floor | 84.0% of the case's floor (4.400 ms); "
                               "of TARGETS.md's 3.75 ms **85.2%** |") for line in lines)
    looped_line = next(line for line in lines if line.startswith("| the looped kernel"))
    assert "3.2-1B B=1 ctx=512 0.67×; 3.2-1B B=8 ctx=512 **1.20×**" in looped_line


def test_check_fails_on_a_stale_table(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{targets.BEGIN}\nold\n{targets.END}\nrest\n")
    llm_readme = tmp_path / "LLM.md"
    llm_readme.write_text(f"{targets.BEGIN}\n{targets.END}\n")
    monkeypatch.setattr(targets, "README", readme)
    monkeypatch.setattr(targets, "LLM_README", llm_readme)
    assert targets.main(["--check"]) == 1
    assert targets.main([]) == 0
    assert targets.main(["--check"]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "old" not in text
    readme.write_text("no markers\n")
    assert targets.main(["--check"]) == 1
