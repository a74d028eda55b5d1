"""gnnfuse's targets table: generated from the committed records, ratios and marks as TARGETS.md sets them."""

from benchmarks import targets
from fusecore.report import Record, write_jsonl


def _row(case: str, implementation: str, ms: float, **extra) -> Record:
    env = {"commit": "abc1234", "date": "2026-11-28T10:00:00+00:00"}
    return Record(domain="gnn", case=case, implementation=implementation, median_ms=ms, p20_ms=ms, p80_ms=ms,
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


def test_check_fails_on_a_stale_table(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{targets.BEGIN}\nold\n{targets.END}\nrest\n")
    monkeypatch.setattr(targets, "README", readme)
    assert targets.main(["--check"]) == 1
    assert targets.main([]) == 0
    assert targets.main(["--check"]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "old" not in text
    readme.write_text("no markers\n")
    assert targets.main(["--check"]) == 1
