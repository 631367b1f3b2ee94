"""Learning tests: the tuned examples train the tiny base model for real (minutes, not seconds).

Run them on their own: `python -m pytest -m learning`. They build `tiny-sql-math` on first use.
Each compares the policy with itself before training on a fixed validation subset (same
prompts, same sampling seed), so prompt-sampling noise in the training reward does not decide
the outcome.
"""

import pathlib

import numpy as np
import pytest

from rllib_dph.cli.experiments import load_tuned_example

pytestmark = pytest.mark.learning
REPO = pathlib.Path(__file__).resolve().parents[1]
#: The first 150 prompts of the in-domain test split, 4 samples each at the training temperature.
VALIDATION = dict(val_env_config={"data": "sql_synth/test"}, val_n=4, val_limit=150)


def _train(example: str, iterations: int, tmp_path) -> tuple[dict, list[dict], dict]:
    """Validation metrics before training, the iterations' results, validation metrics after."""
    config, _ = load_tuned_example(str(REPO / example))
    config.held_out(**VALIDATION)
    if hasattr(config, "presample"):
        config.dph(presample={"out_dir": str(tmp_path / "presample")})
    algo = config.build_algo()
    before = algo.evaluate_held_out()
    results = [algo.train() for _ in range(iterations)]
    after = algo.evaluate_held_out()
    algo.stop()
    return before, results, after


def _rolling(values: list[float], window: int) -> list[float]:
    return [float(np.mean(values[i : i + window])) for i in range(0, len(values), window)]


def test_grpo_raises_pass_at_1_and_training_reward(ray_session, tmp_path):
    before, results, after = _train("tuned_examples/grpo/sql_tiny_grpo.py", 80, tmp_path)
    rewards = [r["env_runners"]["reward_mean"] for r in results]
    print("GRPO training reward, 10-iteration means:", np.round(_rolling(rewards, 10), 3).tolist())
    print(f"validation pass@1 {before['pass@1']:.3f} -> {after['pass@1']:.3f}, "
          f"greedy {before['greedy_accuracy']:.3f} -> {after['greedy_accuracy']:.3f}")
    assert after["pass@1"] > before["pass@1"] + 0.05
    assert np.mean(rewards[-20:]) > np.mean(rewards[:20]) + 0.05


def test_dph_js_learns_on_d_exp_and_stays_close_on_d_pef(ray_session, tmp_path):
    before, results, after = _train("tuned_examples/dph/sql_tiny_dph_js.py", 40, tmp_path)
    learner = [r["learners"]["default_policy"] for r in results]
    u = [x["pef_u_mean"] for x in learner]
    print("DPH-JS pef_u_mean, 10-iteration means:", np.round(_rolling(u, 10), 3).tolist())
    print(f"validation pass@1 {before['pass@1']:.3f} -> {after['pass@1']:.3f}")
    assert all(x["num_pef_tokens"] > 0 for x in learner)
    # The D_pef term keeps the policy's likelihood of the reference answers near π_ref's.
    assert all(0.5 < x < 2.0 for x in u[-10:])
    assert after["pass@1"] > before["pass@1"]
