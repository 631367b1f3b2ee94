"""Faults of env runners: stalls raise named timeouts, a killed runner costs one retry."""

import os
import signal
import time

import numpy as np
import pytest
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_dph import columns as C
from rllib_dph.async_sampling import NUM_ENV_RUNNER_RESTARTS, STALENESS_MAX
from rllib_dph.batch import num_minibatches


def _remote(config, **fault_tolerance):
    return config.copy(copy_frozen=False).env_runners(
        num_env_runners=1, num_cpus_per_env_runner=0.5
    ).fault_tolerance(delay_between_env_runner_restarts_s=0.0, **fault_tolerance)


def _kill_env_runner(algo) -> None:
    """SIGKILL the (single) remote env runner's process."""
    (pid,) = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid(), local_env_runner=False)
    os.kill(pid, signal.SIGKILL)


def test_stalled_env_runner_raises_naming_runner_version_and_timeout(ray_session, tiny_grpo_config):
    algo = _remote(tiny_grpo_config).build_algo()
    # Short timeouts from here on (the build's own weight sync keeps the generous defaults).
    algo._rounds.config = algo.config.copy(copy_frozen=False).env_runners(sample_timeout_s=2.0, weight_sync_timeout_s=2.0)
    # The runner is made to stall: a call that sleeps blocks it (its calls run one at a time)
    # longer than both timeouts, so both waits below end on their timeouts.
    algo.env_runner_group.foreach_env_runner_async(lambda r: time.sleep(15), tag="stall")
    with pytest.raises(TimeoutError, match=r"env runner\(s\) \[1\] .*weight version 0.*sample_timeout_s=2.0 s"):
        algo.sample_groups()
    with pytest.raises(TimeoutError, match=r"env runner\(s\) \[1\] did not take weight version 0 within weight_sync_timeout_s=2.0 s"):
        algo._sync_weights()
    algo.stop()


def _on_policy_gap(algo, batch) -> float:
    """max |π_θ - μ| over the batch's sampled tokens, π_θ the learner's current policy (read in
    the learner's first optimizer step, before it changes anything). The update that follows
    gets random rewards, so it moves the policy."""
    batch[C.REWARDS] = np.random.default_rng(0).integers(0, 2, len(batch[C.REWARDS])).astype(np.float32)
    batch = algo.compute_advantages(batch)
    (results,) = algo.learner_group.update(
        **algo._learner_data(batch),
        num_epochs=1,
        minibatch_size=None,
        num_minibatches=num_minibatches(len(batch[C.INPUT_IDS]), None),
    )
    return float(results[DEFAULT_MODULE_ID]["abs_prob_diff_max"].peek())


def test_killed_env_runner_is_restarted_with_the_current_weights(ray_session, tiny_grpo_config):
    from rllib_dph.env_runner import LLMEnvRunner

    algo = _remote(tiny_grpo_config).training(lr=1e-2).build_algo()
    _on_policy_gap(algo, algo.sample_groups())  # the policy moves away from the initial weights
    algo._sync_weights()  # version 1 (one per update), loaded by the env runner
    _kill_env_runner(algo)
    batch = algo.sample_groups()  # the share fails (then one retry) or waits for the restart
    assert len(batch[C.REWARDS]) == algo.config.train_rows_per_step
    assert algo.metrics.peek(STALENESS_MAX) == 0
    assert algo.env_runner_group.foreach_env_runner(lambda r: r.weights_version, local_env_runner=False) == [1]
    # The restarted runner's μ is the current policy's ...
    assert _on_policy_gap(algo, batch) < 1e-4
    # ... which a runner holding the initial weights would not have sampled with (tiny-random
    # spreads its probability thinly over the vocabulary, so one update moves token
    # probabilities by ~6e-4; the same weights differ by float noise, far below 1e-4).
    assert _on_policy_gap(algo, LLMEnvRunner(config=algo.config).sample(num_prompts=2)) > 3e-4
    result = algo.train()  # the iteration completes
    assert result["training_iteration"] == 1 and result[NUM_ENV_RUNNER_RESTARTS] >= 1
    algo.stop()


def test_killed_env_runner_without_restarts_stops_the_run_naming_it(ray_session, tiny_grpo_config):
    algo = _remote(tiny_grpo_config, restart_failed_env_runners=False).build_algo()
    _kill_env_runner(algo)
    with pytest.raises(RuntimeError, match=r"env runner 1: .*restart_failed_env_runners=False"):
        algo.sample_groups()
    algo.stop()


def test_asynchronous_round_of_a_killed_env_runner_is_sampled_again(ray_session, tiny_grpo_config):
    """A round requested ahead dies with its runner; its share is sampled once more."""
    algo = _remote(tiny_grpo_config).training(max_staleness=1).build_algo()
    algo.train()  # one round is now requested ahead on the runner
    _kill_env_runner(algo)
    # The round ahead may have finished before the kill; then the next one fails.
    result = [algo.train() for _ in range(2)][-1]
    assert result["training_iteration"] == 3 and result[NUM_ENV_RUNNER_RESTARTS] >= 1
    assert result["env_runners"]["num_env_steps_sampled"] >= algo.config.train_rows_per_step
    assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["policy_loss"])
    algo.stop()
