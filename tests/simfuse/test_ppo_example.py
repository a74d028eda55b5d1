"""examples/ppo_cartpole.py runs end to end: two tiny PPO updates and an evaluation."""

import importlib.util
import math
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ppo_cartpole.py"


def test_ppo_example_runs():
    spec = importlib.util.spec_from_file_location("ppo_cartpole", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    score = module.main(["--num-envs", "16", "--num-steps", "8", "--updates", "2", "--minibatches", "2",
                         "--eval-every", "2", "--eval-envs", "16", "--eval-steps", "12"])
    assert math.isfinite(score) and 1.0 <= score <= 12.0
