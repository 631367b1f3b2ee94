"""Fault injection: kill an env runner, a learner and a rollout engine, fill the disk during a
checkpoint save, stall a weight sync and a learner update; print what survived, what was lost and
the time to recover.

Each scenario trains GRPO on the untrained ``tiny-random`` model (SQL suite, 4 prompts x 4
completions, 16 tokens) on Ray with 2 CPUs, injects one fault, and measures:

- detected after: seconds from the injection to the error (or to the restart being noticed);
- recovered after: seconds from the injection to the next finished training iteration, including
  the restore from the last checkpoint where the run had to stop.

The faults are real: ``SIGKILL`` of the actor's process, a full tmpfs (``mount -t tmpfs``, needs
root; the scenario is skipped otherwise), a call that blocks the env runner, a learner whose loss
sleeps. Results and the command: docs/faults.md.

    nice -n 15 python bench/faults.py                 # all scenarios
    nice -n 15 python bench/faults.py --only learner_killed disk_full
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
import traceback

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def base_config():
    from rllib_dph.algorithms.grpo import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=16)
        .training(group_size=4, prompts_per_step=4, lr=1e-3, minibatch_size=8)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .fault_tolerance(delay_between_env_runner_restarts_s=0.0)
        .debugging(seed=0)
    )


def remote_learner(config, **learners):
    return config.learners(num_learners=1, num_cpus_per_learner=0.5, **learners)


def timed_train(algo) -> float:
    t0 = time.perf_counter()
    algo.train()
    return time.perf_counter() - t0


def expect_error(algo, t0: float):
    """Runs an iteration that must fail: (seconds from ``t0`` to the error, the error)."""
    try:
        algo.train()
    except Exception as e:  # the fault's error, reported in the table
        detected = time.perf_counter() - t0
        print(f"the error, after {detected:.1f} s:\n{type(e).__name__}: {e}", flush=True)
        return detected, e
    raise AssertionError("the iteration did not fail")


def resume(checkpoint: str, t0: float) -> tuple[float, int]:
    """Restores the checkpoint and trains one iteration: (seconds since ``t0``, its iteration)."""
    from rllib_dph.algorithms.grpo import GRPO

    algo = GRPO.from_checkpoint(checkpoint)
    iteration = algo.train()["training_iteration"]
    algo.stop()
    return time.perf_counter() - t0, iteration


def first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


@scenario
def env_runner_killed(workdir: str) -> dict:
    from rllib_dph.env_runners.async_sampling import NUM_ENV_RUNNER_RESTARTS

    algo = base_config().build_algo()
    step = timed_train(algo)
    (pid,) = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid(), local_env_runner=False)
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    result = algo.train()
    recovered = time.perf_counter() - t0
    algo.stop()
    return {
        "injected": "SIGKILL of the env runner's process between iterations",
        "detected": f"{recovered:.1f} (within the next iteration)",
        "survived": f"the run: iteration {result['training_iteration']} finished; learner state; restarts={result[NUM_ENV_RUNNER_RESTARTS]}",
        "lost": "the runner's share of the round in flight (sampled again with the current weights)",
        "recovered": f"{recovered:.1f} (a normal iteration: {step:.1f})",
    }


@scenario
def engine_killed(workdir: str) -> dict:
    return {
        "injected": "none separately: the HF engine (and vLLM's default in-process core) lives in the env runner's process",
        "detected": "as env_runner_killed",
        "survived": "as env_runner_killed",
        "lost": "as env_runner_killed",
        "recovered": "as env_runner_killed",
    }


def fail_after_a_checkpoint(workdir: str, name: str, config, inject, injected: str, survived: str, lost: str) -> dict:
    """Trains one iteration, checkpoints, ``inject(algo)``s a fault, waits for the error of the next
    iteration, then resumes from the checkpoint and trains one iteration: the scenario's row."""
    algo = config.build_algo()
    algo.train()
    checkpoint = algo.save_to_path(os.path.join(workdir, name))
    inject(algo)
    t0 = time.perf_counter()
    detected, error = expect_error(algo, t0)
    algo.stop()
    recovered, iteration = resume(checkpoint, t0)
    return {
        "injected": injected,
        "detected": f"{detected:.1f}",
        "error": first_line(error),
        "survived": survived,
        "lost": f"{lost}; resumed run reached iteration {iteration}",
        "recovered": f"{recovered:.1f} (restore + 1 iteration)",
    }


def _replace_loss(loss):
    return lambda algo: algo.learner_group.foreach_learner(lambda learner: setattr(learner, "compute_loss_for_module", loss))


def _die(**_):
    os.kill(os.getpid(), signal.SIGKILL)


def _sleep(**_):
    time.sleep(30)


@scenario
def learner_killed(workdir: str) -> dict:
    return fail_after_a_checkpoint(
        workdir, "learner_killed", remote_learner(base_config()), _replace_loss(_die),
        "SIGKILL of the learner's process inside its update (iteration 2)",
        "checkpoint of iteration 1 (restored, trained on)", "iteration 2's samples and update",
    )


@scenario
def learner_update_stalled(workdir: str) -> dict:
    return fail_after_a_checkpoint(
        workdir, "learner_stalled", remote_learner(base_config(), learner_update_timeout_s=5.0), _replace_loss(_sleep),
        "the learner's loss sleeps 30 s (learner_update_timeout_s=5)", "checkpoint of iteration 1", "iteration 2",
    )


@scenario
def weight_sync_stalled(workdir: str) -> dict:
    # From the injection on, loading weights blocks the env runner. Iteration 2 samples with the
    # weights the runner holds already (no load), then the weight sync after its update stalls.
    def stall_loads(algo):
        algo.env_runner_group.foreach_env_runner(
            lambda r: setattr(r, "_load_module_state", lambda state: time.sleep(30)), local_env_runner=False
        )

    return fail_after_a_checkpoint(
        workdir, "sync_stalled", base_config().env_runners(weight_sync_timeout_s=5.0), stall_loads,
        "loading new weights blocks the env runner for 30 s (weight_sync_timeout_s=5)", "checkpoint of iteration 1",
        "iteration 2",
    )


@scenario
def disk_full(workdir: str) -> dict:
    mount = os.path.join(workdir, "tmpfs")
    os.makedirs(mount)
    algo = base_config().build_algo()
    algo.train()
    size = _tree_bytes(algo.save_to_path(os.path.join(workdir, "size_probe")))
    try:  # room for one checkpoint and a half: the second save, written beside the first, fills it
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size * 1.5)}", "tmpfs", mount], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        algo.stop()
        return {"injected": f"skipped: cannot mount a tmpfs ({e}); needs root", "detected": "-", "survived": "-", "lost": "-", "recovered": "-"}
    try:
        checkpoint = algo.save_to_path(os.path.join(mount, "checkpoint"))
        algo.train()
        t0 = time.perf_counter()
        try:
            algo.save_to_path(checkpoint)
            raise AssertionError("the save did not fail")
        except OSError as e:
            detected, error = time.perf_counter() - t0, e
        leftovers = sorted(set(os.listdir(mount)) - {"checkpoint"})
        algo.stop()
        recovered, iteration = resume(checkpoint, t0)
    finally:
        subprocess.run(["umount", mount], check=False)
    return {
        "injected": f"checkpoint save onto a full tmpfs ({size * 1.5 / 2**20:.1f} MiB, one checkpoint {size / 2**20:.1f} MiB)",
        "detected": f"{detected:.1f}",
        "error": first_line(error),
        "survived": "the previous checkpoint (iteration 1), loaded and trained on",
        "lost": f"the save of iteration 2; leftovers beside it: {leftovers or 'none'}; resumed run reached iteration {iteration}",
        "recovered": f"{recovered:.1f} (restore + 1 iteration)",
    }


def _rllib_train(storage: str, *extra: str) -> subprocess.CompletedProcess:
    """``rllib train`` of the base config's GRPO to 6 iterations, a checkpoint every iteration."""
    import json
    import sys

    config = {"model_name": "tiny-random", "max_response_length": 16, "group_size": 4, "prompts_per_step": 4,
              "env_config": {"data": "sql_synth/test"}}
    command = [sys.executable, "-m", "rllib_dph.cli", "train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0",
               "--config", json.dumps(config), "--stop", json.dumps({"training_iteration": 6}), "--storage-path",
               storage, "--name", "exp", "--checkpoint-freq", "1", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


@scenario
def storage_full_in_a_run(workdir: str) -> dict:
    """``rllib train --storage-path`` on a tmpfs that holds two checkpoints (the ones Tune keeps)
    but not a third beside them: Tune's copy of checkpoint 3 fills it. Then the tmpfs grows and
    ``rllib train --resume`` continues from the newest intact checkpoint."""
    import json

    from rllib_dph.algorithms.checkpoints import newest_intact

    probe = os.path.join(workdir, "probe")
    algo = base_config().build_algo()
    algo.train()
    size = _tree_bytes(algo.save_to_path(probe))
    algo.stop()
    mount = os.path.join(workdir, "storage_tmpfs")
    os.makedirs(mount)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size * 2.6)}", "tmpfs", mount], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return {"injected": f"skipped: cannot mount a tmpfs ({e}); needs root", "detected": "-", "survived": "-",
                "lost": "-", "recovered": "-"}
    try:
        t0 = time.perf_counter()
        full = _rllib_train(mount)
        detected = time.perf_counter() - t0
        error = [line for line in (full.stdout + full.stderr).splitlines() if "saving a checkpoint" in line]
        print(full.stdout[-3000:], full.stderr[-3000:], sep="\n", flush=True)
        intact = newest_intact(os.path.join(mount, "exp"))
        subprocess.run(["mount", "-o", f"remount,size={int(size * 8)}", mount], check=True)
        t1 = time.perf_counter()
        resumed = _rllib_train(mount, "--resume")
        recovered = time.perf_counter() - t1
        print(resumed.stdout[-3000:], resumed.stderr[-6000:], sep="\n", flush=True)
        (trial,) = [os.path.join(mount, "exp", d) for d in os.listdir(os.path.join(mount, "exp")) if d.startswith("GRPO_")]
        with open(os.path.join(trial, "result.json")) as f:
            rows = [line for line in f if line.strip()]
        iterations = []
        for line in rows:  # a row cut short by the full disk is counted, not parsed
            try:
                iterations.append(json.loads(line)["training_iteration"])
            except json.JSONDecodeError:
                iterations.append("cut short")
    finally:
        subprocess.run(["umount", mount], check=False)
    return {
        "injected": f"rllib train --checkpoint-freq 1 onto a {size * 2.6 / 2**20:.1f} MiB tmpfs (one checkpoint "
                    f"{size / 2**20:.1f} MiB)",
        "detected": f"{detected:.1f} (the whole first run, exit {full.returncode})",
        "error": error[0][:300] if error else f"no 'saving a checkpoint' line; exit {full.returncode}",
        "survived": f"newest intact checkpoint {os.path.basename(intact) if intact else None}",
        "lost": f"--resume (exit {resumed.returncode}) trained iterations {iterations}",
        "recovered": f"{recovered:.1f} (--resume to iteration 6)",
    }


def _tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    args = parser.parse_args()
    import ray

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="rllib_dph_faults_") as workdir:
        for name in args.only:
            print(f"--- {name}", flush=True)
            try:
                rows[name] = SCENARIOS[name](workdir)
            except Exception:  # one broken scenario must not hide the others' results
                rows[name] = {"injected": "scenario failed: " + traceback.format_exc(limit=1).splitlines()[-1]}
            print(rows[name], flush=True)
    ray.shutdown()
    print("\n| fault | injected | detected after (s) | error | survived | lost | recovered after (s) |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        cells = [row.get(k, "-") for k in ("injected", "detected", "error", "survived", "lost", "recovered")]
        print(f"| {name} | " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")


if __name__ == "__main__":
    main()
