"""Faults: stalls raise named timeouts (env runners, learners, collectives, the math checker
pool), a killed env runner costs one retry, a killed learner stops the run naming it and the run
resumes from the last checkpoint."""

import multiprocessing
import os
import signal
import socket
import time

import numpy as np
import pytest
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_dph import columns as C
from rllib_dph.env_runners.async_sampling import NUM_ENV_RUNNER_RESTARTS, STALENESS_MAX
from rllib_dph.learners.splits import num_minibatches


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
    from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner

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


@pytest.mark.slow
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


# ---------------------------------------------------------------------------------- learners
def _remote_learner(config, **learners):
    return config.copy(copy_frozen=False).learners(num_learners=1, num_cpus_per_learner=0.5, **learners)


def _replace_loss(algo, loss) -> None:
    """Makes the remote learner run ``loss(**kwargs)`` in place of its loss: the fault happens
    inside the update (after the batch reached the learner, before any optimizer step)."""
    algo.learner_group.foreach_learner(lambda learner: setattr(learner, "compute_loss_for_module", loss))


def test_learner_killed_mid_update_is_named_with_its_log_and_the_run_resumes(ray_session, tiny_grpo_config, tmp_path):
    from rllib_dph.algorithms.grpo import GRPO
    from rllib_dph.learners.remote_calls import LearnerFailed

    algo = _remote_learner(tiny_grpo_config).build_algo()
    algo.train()
    checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))

    def die(**_):  # local: pickled by value (the learner cannot import this test module)
        print("fault injection: this learner kills itself mid-update", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    _replace_loss(algo, die)
    with pytest.raises(LearnerFailed, match=r"learner 0 \(actor [0-9a-f]+, pid \d+\) failed during the learner update") as error:
        algo.train()
    assert "fault injection: this learner kills itself mid-update" in str(error.value)  # its log
    assert "Continue from the last checkpoint" in str(error.value)
    algo.stop()

    resumed = GRPO.from_checkpoint(checkpoint)
    assert resumed.iteration == 1 and resumed._rounds.weights.version == 1  # the update before the kill
    result = resumed.train()
    assert result["training_iteration"] == 2
    assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["policy_loss"])
    resumed.stop()


@pytest.mark.slow
def test_stalled_learner_update_raises_naming_learner_and_timeout(ray_session, tiny_grpo_config):
    algo = _remote_learner(tiny_grpo_config, learner_update_timeout_s=2.0).build_algo()
    _replace_loss(algo, lambda **_: time.sleep(30))
    start = time.monotonic()
    with pytest.raises(
        TimeoutError, match=r"learner 0 \(actor .*\) did not finish the learner update within learner_update_timeout_s=2.0 s.*learners\(learner_update_timeout_s=...\)"
    ):
        algo.train()
    assert time.monotonic() - start < 25  # the timeout, not the stall, ended the wait
    algo.stop()


@pytest.mark.slow
def test_stalled_weight_read_raises_naming_learner_and_timeout(ray_session, tiny_grpo_config):
    """Reading the learner's new weights after its update is bounded by weight_sync_timeout_s."""
    algo = _remote_learner(tiny_grpo_config).env_runners(weight_sync_timeout_s=3.0).build_algo()

    def stall(*_, **__):  # local: pickled by value (the learner cannot import this test module)
        time.sleep(30)

    algo.learner_group.foreach_learner(lambda learner: setattr(learner, "get_state", stall))
    start = time.monotonic()
    with pytest.raises(
        TimeoutError, match=r"learner 0 \(actor .*\) did not finish reading the learner's weights within "
        r"weight_sync_timeout_s=3.0 s.*env_runners\(weight_sync_timeout_s=...\)"
    ):
        algo.train()
    assert time.monotonic() - start < 25  # the timeout, not the stall, ended the wait
    algo.stop()


@pytest.mark.slow
def test_stalled_checkpoint_read_raises_naming_learner_and_timeout(ray_session, tiny_grpo_config, tmp_path):
    """A checkpoint reads the learner's state within learner_update_timeout_s (RLlib's own read
    waits forever); the checkpoint that was there before stays."""
    from rllib_dph.algorithms.grpo import GRPO

    algo = _remote_learner(tiny_grpo_config, learner_update_timeout_s=3.0).build_algo()
    algo.train()
    checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))

    def stall(*_, **__):  # local: pickled by value (the learner cannot import this test module)
        time.sleep(30)

    algo.learner_group.foreach_learner(lambda learner: setattr(learner, "get_state", stall))
    start = time.monotonic()
    with pytest.raises(
        TimeoutError, match=r"learner 0 \(actor .*\) did not finish reading the learner's state within "
        r"learner_update_timeout_s=3.0 s.*learners\(learner_update_timeout_s=...\)"
    ):
        algo.save_to_path(checkpoint)
    assert time.monotonic() - start < 25  # the timeout, not the stall, ended the wait
    algo.stop()
    assert GRPO.from_checkpoint(checkpoint).iteration == 1


@pytest.mark.parametrize("field", ["learner_update_timeout_s", "collective_timeout_s"])
def test_learner_timeouts_are_validated(tiny_grpo_config, field):
    with pytest.raises(ValueError, match=field):
        tiny_grpo_config.learners(**{field: 0}).validate()


# ------------------------------------------------------------------------------- collectives
def _all_reduce_alone(rank: int, port: int, messages, done) -> None:
    """Rank 0 reduces; rank 1 is alive but never joins (a stuck learner)."""
    import torch
    import torch.distributed as dist

    from rllib_dph.learners.collectives import all_reduce, set_timeout

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    set_timeout(1.5)
    if rank == 0:
        try:
            all_reduce(torch.ones(3))
            messages.put("no error")
        except TimeoutError as e:
            messages.put(str(e))
    done.wait(60)


def test_collective_with_a_stuck_learner_raises_naming_it_and_the_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    messages, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_all_reduce_alone, args=(rank, port, messages, done)) for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        message = messages.get(timeout=120)
    finally:
        done.set()
        for p in procs:
            p.join(30)
    assert "learner rank 0: all_reduce of a (3,) tensor between 2 learners did not complete within collective_timeout_s=1.5 s" in message
    assert "learners(collective_timeout_s=...)" in message


# ------------------------------------------------------------------------- verifier pools
def test_math_check_waiting_for_a_busy_pool_raises_naming_it_then_the_pool_works_again():
    from rllib_dph.envs import math as M
    from rllib_dph.envs.arguments import ArgumentError
    from rllib_dph.envs.isolation import _POOL

    size, wait_s = _POOL.size, _POOL.wait_s
    M.set_checker_pool(size=1, wait_s=0.5)
    held = _POOL._acquire()  # the pool's only checker, busy
    try:
        with pytest.raises(M.CheckerPoolTimeout, match=r"pool \(size=1\): waited wait_s=0.5 s for a free checker.*set_checker_pool"):
            M.verify_math("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}")
    finally:
        _POOL._release(held)
    # The abandoned turn does not block the next check.
    assert M.verify_math("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}").reward == 1.0
    M.set_checker_pool(size=size, wait_s=wait_s)
    with pytest.raises(ArgumentError, match="wait_s"):
        M.set_checker_pool(wait_s=float("inf"))
