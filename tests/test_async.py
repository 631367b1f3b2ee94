"""Asynchronous sampling (``max_staleness``): weight versions, the staleness bound, resume."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_dph import columns as C
from rllib_dph.env_runners.async_sampling import (
    NUM_STALE_ROWS_DROPPED,
    STALENESS_MAX,
    STALENESS_MEAN,
    WEIGHTS_VERSION,
    PublishedWeights,
    SamplingRounds,
    drop_stale_rows,
    publish_weights,
    split_prompts,
)

from extras import needs_peft

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_drop_stale_rows_keeps_rows_within_the_bound():
    # Two rows per group; the learner is at version 5, bound 1.
    versions = np.array([5, 5, 4, 4, 2, 2, 7, 7])
    batch = {C.REWARDS: np.arange(8.0), C.GROUP_IDS: np.repeat(np.arange(4), 2), C.WEIGHT_VERSION: versions}
    kept, staleness, dropped = drop_stale_rows(batch, version=5, max_staleness=1)
    # Version 2 is 3 updates old, version 7 is from weights this learner never had.
    np.testing.assert_array_equal(kept[C.REWARDS], [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(staleness, [0, 0, 1, 1])
    assert dropped == 4 and list(kept[C.WEIGHT_VERSION]) == [5, 5, 4, 4]  # removed once the step's rows are chosen
    assert len(batch[C.WEIGHT_VERSION]) == 8  # the caller's batch is left as it was
    _, staleness, dropped = drop_stale_rows(batch, version=5, max_staleness=3)
    assert dropped == 2 and staleness.max() == 3


def test_staleness_is_that_of_the_rows_the_step_keeps():
    """With dynamic sampling a step's rows come from several rounds: the logged staleness is that
    of the rows kept, not of the last round drawn (which may be discarded for lack of signal)."""
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    rounds = SamplingRounds(group=None, config=None, metrics=MetricsLogger())
    rounds.weights = PublishedWeights(version=2, state=None)
    kept = {C.REWARDS: np.arange(6.0), C.WEIGHT_VERSION: np.array([1, 1, 1, 1, 2, 2])}  # 2 rounds
    batch = rounds.strip_versions(kept)
    assert C.WEIGHT_VERSION not in batch and C.WEIGHT_VERSION in kept
    assert rounds.metrics.peek(STALENESS_MAX) == 1
    assert rounds.metrics.peek(STALENESS_MEAN) == pytest.approx(4 / 6)


def test_published_weights_are_numpy_arrays_in_the_object_store(ray_session):
    """Weights go into Ray's object store as numpy arrays (out-of-band buffers, mapped without a
    copy on get), not as pickled torch tensors; bfloat16, which numpy lacks, stays a tensor; the
    values and the version survive, and the publication is a snapshot of the state it was given."""
    import torch

    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    state = {"rl_module": {DEFAULT_MODULE_ID: {"w": weight, "b": torch.ones(2, dtype=torch.bfloat16),
                                               "lora_settings": {"r": 4}}}, "weights_seq_no": 7}
    published = publish_weights(state)
    weight.add_(100.0)  # the learner updates in place after publishing
    got = ray_session.get(published.state)
    assert published.version == got["weights_seq_no"] == 7
    module = got["rl_module"][DEFAULT_MODULE_ID]
    assert isinstance(module["w"], np.ndarray) and not module["w"].flags.writeable  # mapped from the store
    np.testing.assert_array_equal(module["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(module["b"], torch.Tensor) and module["b"].dtype == torch.bfloat16
    assert module["lora_settings"] == {"r": 4}


def test_split_prompts_over_env_runners():
    assert split_prompts(5, [1, 2]) == {1: 3, 2: 2}
    assert split_prompts(4, [2]) == {2: 4}
    assert split_prompts(1, [1, 2]) == {1: 1}


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"max_staleness": 1, "num_env_runners": 0}, "max_staleness=1 samples on remote env runners"),
        ({"max_staleness": -1}, "max_staleness=-1 is invalid"),
        ({"sample_timeout_s": float("inf")}, "sample_timeout_s=inf is invalid"),
        ({"weight_sync_timeout_s": 0}, "weight_sync_timeout_s=0 is invalid"),
    ],
)
def test_validate_refuses_bad_async_settings(tiny_grpo_config, overrides, message):
    config = tiny_grpo_config.copy(copy_frozen=False)
    config.update_from_dict(overrides)
    with pytest.raises(ValueError) as err:
        config.validate()
    assert message in str(err.value)


def _two_steps(config):
    """Learner metrics and the iteration results of two training iterations."""
    algo = config.build_algo()
    results = [algo.train() for _ in range(2)]
    pending = list(algo._rounds._pending)
    algo.stop()
    return results, pending


@pytest.mark.slow
def test_async_samples_ahead_with_older_weights_and_k0_is_synchronous(ray_session, tiny_grpo_config):
    base = tiny_grpo_config.copy(copy_frozen=False).env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
    sync, sync_pending = _two_steps(base.copy(copy_frozen=False).training(max_staleness=0))
    asyn, asyn_pending = _two_steps(base.copy(copy_frozen=False).training(max_staleness=1))
    # Step 1 trains on the same batch (both sampled with the initial weights): same update.
    for key in ("policy_loss", "abs_prob_diff_max", "grad_norm"):
        s, a = sync[0]["learners"][DEFAULT_MODULE_ID], asyn[0]["learners"][DEFAULT_MODULE_ID]
        if key in s:
            assert s[key] == a[key], key
    assert sync[0]["env_runners"]["reward_mean"] == asyn[0]["env_runners"]["reward_mean"]
    # Synchronous: every row fresh, nothing requested ahead.
    assert [r[STALENESS_MAX] for r in sync] == [0, 0] and not sync_pending
    # Asynchronous: step 2 trains on rows sampled with version 0 while the learner was at 1;
    # the round for step 3 was requested before step 2's update, with version 1.
    assert asyn[1][STALENESS_MAX] == 1 and asyn[1][STALENESS_MEAN] == 1.0
    assert [r[WEIGHTS_VERSION] for r in asyn] == [1, 2]
    assert [p.weights.version for p in asyn_pending] == [1]
    assert all(r[NUM_STALE_ROWS_DROPPED] == 0 for r in sync + asyn)
    assert asyn[1]["env_runners"]["num_env_steps_sampled"] == base.train_rows_per_step


@pytest.mark.slow
def test_resume_keeps_version_and_bound_and_discards_rows_sampled_before(ray_session, tiny_grpo_config, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    config = tiny_grpo_config.copy(copy_frozen=False).env_runners(
        num_env_runners=1, num_cpus_per_env_runner=0.5
    ).training(max_staleness=1)
    algo = config.build_algo()
    algo.train()
    algo.train()
    algo.save_to_path(str(tmp_path))  # version 2; the round ahead (version 1) is saved with it
    algo.train()  # version 3; the round ahead now carries version 2
    algo.restore_from_path(str(tmp_path))  # back to version 2: that round ahead is discarded
    (kept,) = algo._rounds._pending  # the checkpoint's round ahead comes next
    assert kept.results is not None and algo._rounds.weights.version == 2
    result = algo.train()
    # The restored run trains on the checkpoint's round (version 1, one update behind), as the
    # run that saved it did, not on the round requested before the restore (version 2).
    assert result[STALENESS_MAX] == 1 and result[WEIGHTS_VERSION] == 3
    algo.stop()

    resumed = Algorithm.from_checkpoint(str(tmp_path))
    assert resumed.config.max_staleness == 1 and resumed._rounds.weights.version == 2
    versions = resumed.env_runner_group.foreach_env_runner(lambda r: r.weights_version, local_env_runner=False)
    assert versions == [2]
    result = resumed.train()
    assert result[WEIGHTS_VERSION] == 3 and result[STALENESS_MAX] == 1
    resumed.stop()


# ---------------------------------------------------------------------- composes
def _runner_weight_sums(algo) -> list[dict[str, float]]:
    """Each remote env runner's version and engine weights (parameter sums), read after the
    calls queued before this one (an env runner runs one call at a time)."""
    return algo.env_runner_group.foreach_env_runner(
        lambda r: {"version": r.weights_version, **{k: v.double().sum().item() for k, v in r.engine.model.state_dict().items()}},
        local_env_runner=False,
    )


def test_async_dph_pef_rows_join_every_update_and_are_never_stale(ray_session, tmp_path):
    """DPH-JS one round ahead: each update holds the D_pef rows its ratio asks for, none of them
    is dropped or counted in the staleness of the exploration rows, and the D_pef term stays finite.
    (The SQL env, not test_dph's toy env: a remote env runner cannot import a test module.)"""
    from rllib_dph.algorithms.dph import DPHConfig

    config = (
        DPHConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test[:8]"})
        .llm(model_name="tiny-sql-math", temperature=1.0, max_response_length=32)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .training(group_size=4, prompts_per_step=2, lr=1e-3, minibatch_size=None, max_staleness=1)
        .dph(divergence="js", pef_coeff=0.2, pef_ratio=4,
             presample={"out_dir": str(tmp_path / "presample"), "k": 4, "min_correct": 2, "pef_samples": "all"})
        .debugging(seed=0)
    )
    num_exp = config.train_rows_per_step  # 2 prompts x 4 samples
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(3)]
    finally:
        algo.stop()
    for i, result in enumerate(results):
        logged = result["learners"][DEFAULT_MODULE_ID]
        # One mini-batch: all of the update's D_pef rows, num_exp / pef_ratio of them.
        assert logged["pef_rows_min"] == logged["pef_rows_max"] == num_exp // 4, i
        assert logged["num_pef_tokens"] > 0 and np.isfinite(logged["pef_loss"]), i
        assert result[NUM_STALE_ROWS_DROPPED] == 0, i
        assert result["env_runners"]["num_env_steps_sampled"] == num_exp, i  # D_pef rows are not sampled
    # Exploration rows are exactly one version old from step 2 on; D_pef rows would have no version.
    assert [r[STALENESS_MEAN] for r in results] == [0.0, 1.0, 1.0]
    assert [r[STALENESS_MAX] for r in results] == [0, 1, 1]
    # The policy moved away from the stored π_ref: the D_pef term sees it.
    assert results[-1]["learners"][DEFAULT_MODULE_ID]["pef_u_mean"] != pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "learners, llm",
    [
        ({"sharding": "fsdp2", "num_learners": 2, "num_cpus_per_learner": 0.5}, {}),
        ({"sharding": "ddp", "num_learners": 2, "num_cpus_per_learner": 0.5}, {}),
        pytest.param({}, {"lora": {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}}, marks=needs_peft),
    ],
    ids=["fsdp2", "ddp", "lora"],
)
def test_async_sampling_runs_each_round_on_the_weights_it_was_requested_with(ray_session, tiny_grpo_config, learners, llm):
    """Two FSDP2 learners (gloo), two DDP learners, or LoRA adapters on the local learner, with one
    env runner one round ahead: the runner samples each round with the (gathered, or adapter-only)
    weights of the version it was requested with."""
    config = (
        tiny_grpo_config.copy(copy_frozen=False)
        .learners(**learners)
        .llm(**llm)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        # tiny-random scores 0 on every SQL task (no advantage): the entropy bonus moves the weights.
        .training(max_staleness=1, entropy_coeff=0.01)
    )
    algo = config.build_algo()
    try:
        initial = _runner_weight_sums(algo)[0]
        first = algo.train()
        second = algo.train()
        runner = _runner_weight_sums(algo)[0]  # after the round requested ahead with version 1
        ahead = algo._rounds._pending[0].weights
        published = ray_session.get(ahead.state)["rl_module"][DEFAULT_MODULE_ID]
    finally:
        algo.stop()
    assert [first[WEIGHTS_VERSION], second[WEIGHTS_VERSION]] == [1, 2]
    assert second[STALENESS_MEAN] == 1.0 and second[NUM_STALE_ROWS_DROPPED] == 0
    assert initial["version"] == 0 and runner["version"] == ahead.version == 1
    # The runner holds the learners' version-1 weights (full and gathered, or the adapters), not
    # the initial ones. (A LoRA publication also carries its settings, which are not a tensor.)
    published = {k: v for k, v in published.items() if hasattr(v, "shape")}
    assert set(published) <= set(runner) and published
    for name, value in published.items():
        assert runner[name] == pytest.approx(float(np.asarray(value, dtype=np.float64).sum()), rel=1e-5, abs=1e-5), name
    assert any(runner[name] != initial[name] for name in published)


@pytest.mark.parametrize(
    "example, overrides",
    [
        ("grpo/sql_tiny_grpo_async.py", {}),
        # Pre-samples 8 training prompts into the test's folder instead of the example's cache.
        ("dph/sql_tiny_dph_js_async.py", {"env_config": {"data": "sql_synth/train[:8]"},
                                          "presample": {"k": 4, "min_correct": 2}}),
        # Two env runners share each round (the driver and both fit 2 CPUs).
        ("grpo/sql_tiny_grpo_async.py", {"num_env_runners": 2, "num_cpus_per_env_runner": 0.5}),
    ],
    ids=["grpo", "dph_js", "grpo_2_runners"],
)
@pytest.mark.slow
def test_rllib_train_runs_the_async_tuned_examples(tmp_path, example, overrides):
    """`rllib train file` on the asynchronous tuned examples, through Tune, on a smaller budget:
    the second iteration trains rows at most one version old and drops none."""
    overrides = {"max_response_length": 32, "group_size": 4, "prompts_per_step": 2, **overrides}
    if "presample" in overrides:
        overrides["presample"]["out_dir"] = str(tmp_path / "presample")
    cmd = [
        sys.executable, "-m", "rllib_dph.cli", "train", "file", str(REPO / "tuned_examples" / example),
        "--stop", json.dumps({"training_iteration": 2}), "--config", json.dumps(overrides),
        "--storage-path", str(tmp_path), "--name", "async", "-v", "0",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    trial_dir = next(p for p in (tmp_path / "async").iterdir() if p.is_dir())
    results = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in results] == [1, 2]
    assert results[-1]["config"]["max_staleness"] == 1
    assert [r[WEIGHTS_VERSION] for r in results] == [1, 2]
    assert all(r[NUM_STALE_ROWS_DROPPED] == 0 for r in results)
    if not results[-1]["config"]["dynamic_sampling"]:
        assert [r[STALENESS_MAX] for r in results] == [0, 1] and results[-1][STALENESS_MEAN] == 1.0
    else:  # the step's later rounds sample with the current weights: its rows are 0 or 1 versions old
        assert results[-1][STALENESS_MAX] <= 1 and results[-1]["dynamic_sampling_rounds"] >= 1
    if "presample" in overrides:  # DPH: D_pef rows in both updates
        assert all(r["learners"][DEFAULT_MODULE_ID]["pef_rows_max"] > 0 for r in results)


@pytest.mark.slow
def test_rllib_train_async_run_killed_with_sigkill_resumes_its_version_and_bound(tmp_path):
    """`rllib train` one round ahead (k = 1, one remote env runner), killed with SIGKILL after a
    checkpoint, then `--resume`d: the resumed iterations continue the checkpoint's
    weight version, keep the bound (k = 1 again from the second resumed iteration), and the first
    resumed update trains only rows sampled with the restored weights (staleness 0): rows sampled
    before the kill, or with weights the checkpoint never had, are not trained as fresh."""
    import os
    import signal
    import time

    stop = 60  # iterations take ~0.3-0.5 s: room to kill the run before it ends, also on a busy machine
    args = [
        sys.executable, "-m", "rllib_dph.cli", "train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0",
        "--config", json.dumps({
            "model_name": "tiny-random", "max_response_length": 16, "group_size": 2, "prompts_per_step": 2,
            "env_config": {"data": "sql_synth/test"}, "num_env_runners": 1, "num_cpus_per_env_runner": 0.5,
            "max_staleness": 1,
        }),
        "--stop", json.dumps({"training_iteration": stop}), "--checkpoint-freq", "1", "--keep-checkpoints-num", "0",
        "--storage-path", str(tmp_path), "--name", "async_resume", "-v", "0",
    ]
    # Tune resumes from the last experiment state it synced to the storage folder (with the trials'
    # result.json); by default it syncs every 10 s or more, here every second.
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    deadline = time.time() + 300
    experiment = tmp_path / "async_resume"

    def saved() -> int:
        """Iterations with a complete checkpoint and a result line in the storage folder."""
        trials = list(experiment.glob("GRPO_*"))
        if not trials:
            return 0
        return min(len(list(trials[0].glob("checkpoint_*/rllib_checkpoint.json"))), len(_trial_results(trials[0])))

    while saved() < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    trial = next(experiment.glob("GRPO_*"))
    before = _trial_results(trial)
    checkpoints = len(list(trial.glob("checkpoint_*/rllib_checkpoint.json")))
    assert 3 <= len(before) < stop, "the run ended before it was killed, or never synced its results"

    out = subprocess.run(args + ["--resume"], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    results = _trial_results(trial)
    resumed = results[len(before):]  # the resumed run appends to what reached the storage folder
    first = resumed[0]["training_iteration"]
    # Resumed from a checkpoint Tune had registered: at most the last one written.
    assert 1 < first <= checkpoints + 1 and resumed[-1]["training_iteration"] == stop
    # The version counter is the checkpoint's: one learner update per iteration, continued.
    assert [r[WEIGHTS_VERSION] for r in resumed] == list(range(first, stop + 1))
    assert all(r["config"]["max_staleness"] == 1 for r in resumed)
    # The first resumed batch is the round the checkpoint saved ahead, one version old, as the
    # uninterrupted run's would be; every later one is one version old too.
    assert all(r[STALENESS_MEAN] == 1.0 and r[STALENESS_MAX] == 1 for r in resumed)
    assert all(r[NUM_STALE_ROWS_DROPPED] == 0 for r in resumed)


def _trial_results(trial: pathlib.Path) -> list[dict]:
    """The rows of the trial's ``result.json`` in the storage folder (none before Tune first
    synced it there), without a line that SIGKILL cut while it was written."""
    rows, path = [], trial / "result.json"
    for line in (path.read_text().splitlines() if path.is_file() else []):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
