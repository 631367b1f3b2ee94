"""Resume is exact: a run stopped after k iterations and resumed from its checkpoint trains
iterations k+1..N exactly as an uninterrupted run of N iterations does (CPU runs are
deterministic): the same prompts in the same order, the same sampling seeds, the same mini-batch
shuffles, the same D_pef rows, hence the same rewards, losses and final weights. The same holds
with rounds sampled ahead (``max_staleness > 0``), and for a run whose env runner was killed and
restarted by Ray."""

import os
import signal

import numpy as np
import pytest
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


def _straight(config, iterations=ITERATIONS):
    """(traces of ``iterations`` iterations in one run, its final weights)."""
    algo = config.build_algo()
    try:
        return [_trace(algo.train()) for _ in range(iterations)], _weights(algo)
    finally:
        algo.stop()


def _resumed(config, tmp_path, iterations=ITERATIONS):
    """(traces of STOP_AT iterations + a resume from their checkpoint to ``iterations``, the final weights)."""
    algo = config.build_algo()
    try:
        resumed = [_trace(algo.train()) for _ in range(STOP_AT)]
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()
    algo = Algorithm.from_checkpoint(checkpoint)
    try:
        assert algo.iteration == STOP_AT
        resumed += [_trace(algo.train()) for _ in range(iterations - STOP_AT)]
        return resumed, _weights(algo)
    finally:
        algo.stop()


def _straight_and_resumed(config, tmp_path):
    """(traces of ITERATIONS iterations in one run, traces of STOP_AT + a resume to ITERATIONS,
    both runs' final weights)."""
    (straight, straight_weights), (resumed, resumed_weights) = _straight(config), _resumed(config, tmp_path)
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


@pytest.fixture(scope="module")
def straight_grpo(ray_session):
    """The uninterrupted run of ``_toy_grpo_config``: (traces, final weights)."""
    return _straight(_toy_grpo_config())


def test_grpo_resume_on_a_remote_env_runner_equals_an_uninterrupted_run(straight_grpo, tmp_path):
    straight, straight_weights = straight_grpo
    resumed, resumed_weights = _resumed(_toy_grpo_config(), tmp_path)
    _assert_same(straight, resumed, straight_weights, resumed_weights)


@pytest.mark.slow
def test_asynchronous_resume_equals_an_uninterrupted_run(ray_session, tmp_path):
    # One round is sampled ahead: the checkpoint after iteration 1 holds round 2, sampled with
    # the weights before update 1 (which the checkpoint no longer holds); iteration 3 trains on a
    # round the resumed run requests itself, from the positions after round 2.
    config = _toy_grpo_config().training(max_staleness=1)
    straight, straight_weights = _straight(config, iterations=3)
    resumed, resumed_weights = _resumed(config, tmp_path, iterations=3)
    _assert_same(straight, resumed, straight_weights, resumed_weights)


@pytest.mark.slow
def test_a_killed_env_runner_continues_from_its_sampling_position(straight_grpo):
    """Ray restarts a killed env runner at its first prompts; the driver's requests carry the
    position it stood at, so the run samples the prompts and seeds of the uninterrupted run."""
    from rllib_dph.env_runners.async_sampling import NUM_ENV_RUNNER_RESTARTS

    straight, straight_weights = straight_grpo
    algo = _toy_grpo_config().fault_tolerance(delay_between_env_runner_restarts_s=0.0).build_algo()
    try:
        killed = [_trace(algo.train())]
        (pid,) = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid(), local_env_runner=False)
        os.kill(pid, signal.SIGKILL)
        result = algo.train()
        killed.append(_trace(result))
        assert result[NUM_ENV_RUNNER_RESTARTS] >= 1
        (position,) = algo.env_runner_group.foreach_env_runner(lambda r: r.sampling_position(), local_env_runner=False)
        assert position == algo._rounds.positions[1] == {"prompts_taken": 8, "num_calls": 2}
        _assert_same(straight, killed, straight_weights, _weights(algo))
    finally:
        algo.stop()


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


@pytest.mark.slow
def test_dph_resume_with_two_learners_equals_an_uninterrupted_run(ray_session, presampled, tmp_path):  # noqa: F811
    # Three groups over two DDP learners (gloo on CPU): learner 0 trains on two, learner 1 on one,
    # so they take different numbers of D_pef rows; the checkpoint holds learner 0's state, which
    # lists every learner's position in its D_pef shard.
    out, _ = presampled
    config = _dph_config(out / "d_pef.parquet", divergence="js", pef_coeff=0.2, pef_ratio=2).training(
        prompts_per_step=3, num_epochs=2, minibatch_size=4
    ).learners(num_learners=2, num_cpus_per_learner=0.5)
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

