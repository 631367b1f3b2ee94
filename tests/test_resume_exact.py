"""Resume is exact: a run stopped after k iterations and resumed from its checkpoint trains
iterations k+1..N exactly as an uninterrupted run of N iterations does (CPU runs are
deterministic): the same prompts in the same order, the same sampling seeds, the same mini-batch
shuffles, the same D_pef rows, hence the same rewards, losses and final weights."""

import numpy as np
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID

import test_dph
from rllib_dph.algorithms.grpo import GRPOConfig
from test_dph import TOY_ENV, _dph_config, presampled  # noqa: F401  (the module-scoped pre-sampling fixture)

# A remote env runner cannot import tests/: the toy env's verifier travels by value.
ray.cloudpickle.register_pickle_by_value(test_dph)

ITERATIONS, STOP_AT = 2, 1

# Per-iteration values that must agree exactly: what was sampled, and what the update computed.
RUNNER_KEYS = ("reward_mean", "response_length_mean", "accuracy")
LEARNER_KEYS = ("total_loss", "policy_loss", "pef_loss", "pef_rows_min", "pef_rows_max")


def _trace(result: dict) -> dict:
    runners = result["env_runners"]
    learner = result["learners"][DEFAULT_MODULE_ID]
    trace = {key: runners[key] for key in RUNNER_KEYS}
    trace.update({key: learner[key] for key in LEARNER_KEYS if key in learner})
    return trace


def _weights(algo) -> dict:
    state = algo.learner_group.get_state()["learner"]["rl_module"][DEFAULT_MODULE_ID]
    return {k: torch.as_tensor(v).clone() for k, v in state.items()}


def _straight_and_resumed(config, tmp_path):
    """(traces of ITERATIONS iterations in one run, traces of STOP_AT + a resume to ITERATIONS,
    both runs' final weights)."""
    algo = config.build_algo()
    try:
        straight = [_trace(algo.train()) for _ in range(ITERATIONS)]
        straight_weights = _weights(algo)
    finally:
        algo.stop()
    algo = config.build_algo()
    try:
        resumed = [_trace(algo.train()) for _ in range(STOP_AT)]
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()
    algo = Algorithm.from_checkpoint(checkpoint)
    try:
        assert algo.iteration == STOP_AT
        resumed += [_trace(algo.train()) for _ in range(ITERATIONS - STOP_AT)]
        resumed_weights = _weights(algo)
    finally:
        algo.stop()
    return straight, resumed, straight_weights, resumed_weights


def _assert_same(straight, resumed, straight_weights, resumed_weights):
    for i, (a, b) in enumerate(zip(straight, resumed), start=1):
        assert a == b, f"iteration {i}: uninterrupted {a} != resumed {b}"
    for name, value in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], value, rtol=0, atol=0, msg=name)


def _toy_grpo_config():
    """GRPO on the toy env (rewards 1, 0 or either by prompt), sampled by a remote env runner:
    its prompt order and sampling seeds live in its own process; two epochs of two shuffled
    mini-batches per update (the learner's mini-batch shuffles)."""
    return (
        GRPOConfig()
        .environment(TOY_ENV)
        .llm(model_name="tiny-random", max_response_length=8)
        .training(group_size=4, prompts_per_step=4, lr=1e-3, minibatch_size=8, num_epochs=2)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .debugging(seed=0)
    )


def test_grpo_resume_on_a_remote_env_runner_equals_an_uninterrupted_run(ray_session, tmp_path):
    _assert_same(*_straight_and_resumed(_toy_grpo_config(), tmp_path))


def test_dph_resume_equals_an_uninterrupted_run(ray_session, presampled, tmp_path):  # noqa: F811
    # The local env runner samples; the toy env has 18 prompts, so the second iteration starts a
    # new pass of the prompt order; the D_pef file has fewer rows than an update takes, so its
    # order reshuffles too.
    out, _ = presampled
    config = _dph_config(out / "d_pef.parquet", divergence="js", pef_coeff=0.2, pef_ratio=1).training(
        prompts_per_step=12, num_epochs=2, minibatch_size=16
    )
    straight, resumed, *weights = _straight_and_resumed(config, tmp_path)
    assert straight[0]["pef_rows_max"] > 0
    _assert_same(straight, resumed, *weights)


def test_the_checkpoint_holds_each_env_runners_sampling_position(ray_session):
    algo = _toy_grpo_config().build_algo()
    try:
        algo.train()
        state = algo.get_state()
    finally:
        algo.stop()
    from rllib_dph.algorithms.grpo.grpo import SAMPLING_POSITIONS

    positions = state[SAMPLING_POSITIONS]
    assert set(positions) == {1}
    assert positions[1] == {"prompts_taken": 4, "num_calls": 1}
    assert np.isscalar(positions[1]["prompts_taken"])

