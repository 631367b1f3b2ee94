"""Learning tests: the tuned examples train the tiny base model for real (minutes, not seconds).

Run them on their own: `python -m pytest -m learning`. They build `tiny-sql-math` on first use.
"""

import pathlib

import numpy as np
import pytest

from rllib_dph.cli import load_tuned_example

pytestmark = pytest.mark.learning
REPO = pathlib.Path(__file__).resolve().parents[1]


def _train(example: str, iterations: int, tmp_path, **overrides) -> list[dict]:
    config, _ = load_tuned_example(str(REPO / example))
    config.update_from_dict(overrides)
    if hasattr(config, "presample_dir"):
        config.dph(presample_dir=str(tmp_path / "presample"))
    algo = config.build_algo()
    results = [algo.train() for _ in range(iterations)]
    algo.stop()
    return results


def test_grpo_training_reward_rises(ray_session, tmp_path):
    results = _train("tuned_examples/grpo/sql_tiny_grpo.py", 12, tmp_path)
    rewards = [r["env_runners"]["reward_mean"] for r in results]
    print("GRPO training reward per iteration:", np.round(rewards, 3).tolist())
    assert np.mean(rewards[-4:]) > np.mean(rewards[:4]) + 0.05


def test_dph_js_learns_on_d_exp_and_stays_close_on_d_pef(ray_session, tmp_path):
    results = _train("tuned_examples/dph/sql_tiny_dph_js.py", 8, tmp_path)
    learner = [r["learners"]["default_policy"] for r in results]
    u = [x["pef_u_mean"] for x in learner]
    print("DPH-JS pef_u_mean per iteration:", np.round(u, 3).tolist())
    assert all(x["num_pef_tokens"] > 0 for x in learner)
    # The D_pef term keeps the policy's likelihood of the reference answers near π_ref's.
    assert 0.5 < u[-1] < 2.0
    rewards = [r["env_runners"]["reward_mean"] for r in results]
    print("DPH-JS training reward (on D_exp) per iteration:", np.round(rewards, 3).tolist())
    assert np.mean(rewards[-3:]) >= np.mean(rewards[:3])
