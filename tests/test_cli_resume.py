"""Ctrl-C and `--resume` of `rllib train` tell the truth.

Ctrl-C stops after the current iteration with a checkpoint, says where and prints the command that
continues the run, and exits 130; that command trains to the stop the run was started with (an
iteration cap met before a time cap is a finished run, as in Tune and RLlib: the first criterion
met stops); a finished run resumed trains nothing and exits 0; a `--stop` other than the run's is
refused naming `--from-checkpoint`; `--resume` of a crashed trial that saved no checkpoint, or of
no experiment at all, is refused instead of training again from iteration 1 over the results.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllib_dph.cli.main import main
from rllib_dph.cli.experiments import INTERRUPTED_EXIT_CODE, PREFLIGHT_EXIT_CODE, resume_command

REPO = Path(__file__).resolve().parents[1]
RLLIB = [sys.executable, "-m", "rllib_dph.cli"]
CONFIG = {"model_name": "tiny-random", "max_response_length": 16, "group_size": 2, "prompts_per_step": 2,
          "env_config": {"data": "sql_synth/test"}}
#: An iteration cap the run meets long before its time cap.
STOP = {"training_iteration": 8, "time_total_s": 600}


def _train_args(storage: Path, name: str, *extra: str) -> list[str]:
    return ["train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0", "--config", json.dumps(CONFIG),
            "--stop", json.dumps(STOP), "--storage-path", str(storage), "--name", name, *extra]


def _start(args: list[str], log: Path, env=None) -> subprocess.Popen:
    """`rllib <args>` in a process group of its own (Ctrl-C in a terminal reaches the whole group)."""
    return subprocess.Popen(RLLIB + args, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, "the run ended before the test could stop it"
        assert time.time() < deadline, "the run did not get there in time"
        time.sleep(0.1)


def _results(trial: Path) -> list[dict]:
    return [json.loads(line) for line in (trial / "result.json").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run stopped by Ctrl-C after its second iteration: (storage folder, its output, exit code)."""
    storage = tmp_path_factory.mktemp("runs")
    log = storage / "interrupted.log"
    proc = _start(_train_args(storage, "exp"), log)
    _wait_for(lambda: "iter    2" in log.read_text(), proc)
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=120)
    return storage, log.read_text(), code


def _trial(storage: Path) -> Path:
    (trial,) = (storage / "exp").glob("GRPO_*")
    return trial


def test_ctrl_c_saves_a_checkpoint_and_prints_the_command_that_continues(interrupted):
    storage, out, code = interrupted
    assert code == INTERRUPTED_EXIT_CODE, out[-3000:]
    trial = _trial(storage)
    stopped_at = _results(trial)[-1]["training_iteration"]
    assert 2 <= stopped_at < STOP["training_iteration"]
    (checkpoint,) = trial.glob("checkpoint_*")  # the periodic one (every 10) is not due yet: Ctrl-C's
    assert (checkpoint / "rllib_checkpoint.json").is_file()
    assert f"interrupted at iteration {stopped_at}; checkpoint {checkpoint} (iteration {stopped_at})" in out
    assert f"interrupted at iteration {stopped_at}; continue with: rllib train " in out
    assert "continue with: " + shlex.join(["rllib", *_train_args(storage, "exp"), "--resume"]) in out
    assert "training_iteration=" not in out  # no finished-looking summary


def test_the_printed_command_resumes_to_the_iteration_cap_before_the_time_cap(interrupted):
    storage, out, _ = interrupted
    command = shlex.split(out.split("continue with: ")[1].splitlines()[0])
    assert command[0] == "rllib" and command[-1] == "--resume"
    resumed = subprocess.run(RLLIB + command[1:], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    results = _results(_trial(storage))
    assert [r["training_iteration"] for r in results] == list(range(1, STOP["training_iteration"] + 1))
    assert results[-1]["time_total_s"] < STOP["time_total_s"]  # the first criterion met ends the run
    assert "--resume: continuing 1 of 1 trial(s)" in resumed.stdout
    assert f"training_iteration={STOP['training_iteration']}" in resumed.stdout
    assert "rllib: final checkpoint " in resumed.stdout and "  evaluate it:          rllib evaluate " in resumed.stdout


def test_a_finished_run_resumed_trains_nothing_and_exits_0(interrupted):
    storage, _, _ = interrupted
    before = (_trial(storage) / "result.json").read_text()
    resumed = subprocess.run(RLLIB + _train_args(storage, "exp", "--resume"), cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "has finished (stop " in resumed.stdout and "nothing to train" in resumed.stdout
    assert (_trial(storage) / "result.json").read_text() == before


def test_resume_with_another_stop_is_refused_naming_from_checkpoint(interrupted, capsys, without_ray):
    storage, _, _ = interrupted
    args = _train_args(storage, "exp", "--resume")
    args[args.index("--stop") + 1] = json.dumps({"training_iteration": 20})
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    err = capsys.readouterr().err
    assert f'is not the stop {json.dumps(STOP)} that {storage / "exp"} was started with' in err
    assert "--from-checkpoint " + str(sorted(_trial(storage).glob("checkpoint_*"))[-1]) in err


def test_resume_of_no_experiment_is_refused(tmp_path, capsys, without_ray):
    with pytest.raises(SystemExit) as exit_info:
        main(_train_args(tmp_path, "never_ran", "--resume"))
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    assert f"--resume: {tmp_path / 'never_ran'} holds no Tune experiment to continue" in capsys.readouterr().err


def test_resume_of_a_crashed_trial_without_a_checkpoint_is_refused(tmp_path, capsys, without_ray):
    """SIGKILL (a crash) after two iterations of a run that checkpoints only at its end."""
    log = tmp_path / "crashed.log"
    args = _train_args(tmp_path, "exp", "--checkpoint-freq", "0")
    # Tune saves the experiment state (what --resume reads) every second here (default: 10 s or more).
    proc = _start(args, log, env={**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1"})

    def two_results_and_a_state() -> bool:
        trials = list((tmp_path / "exp").glob("GRPO_*/result.json"))
        return bool(trials) and len(trials[0].read_text().splitlines()) >= 2 and \
            any((tmp_path / "exp").glob("experiment_state-*.json"))

    _wait_for(two_results_and_a_state, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with pytest.raises(SystemExit) as exit_info:
        main(args + ["--resume"])
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    err = capsys.readouterr().err
    assert "but saved no checkpoint, so --resume would train it again from iteration 1 over its results" in err


def test_the_resume_command_repeats_the_command_with_its_name():
    command = ["rllib", "train", "file", "x.py", "--from-checkpoint", "/c/checkpoint_000001", "--stop", "{}", "--resume"]
    assert resume_command(command, "exp2") == "rllib train file x.py --stop '{}' --name exp2 --resume"
    assert resume_command(["rllib", "train", "--name=a b"], "a b") == "rllib train --name 'a b' --resume"


def test_ctrl_c_presses_stop_in_steps():
    """First press: the trials finish their iteration (Tune's stop not called yet); second: Tune's
    own stop (its SIGUSR1 handler); third: KeyboardInterrupt."""
    from rllib_dph.cli import interrupt

    stops = []
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where pytest was started in the background
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: stops.append(signum))
    try:
        with interrupt.catching_ctrl_c():
            interrupt.GracefulInterrupt().setup()
            os.kill(os.getpid(), signal.SIGINT)
            assert stops == [] and interrupt._PRESSES.count == 1
            os.kill(os.getpid(), signal.SIGINT)
            assert stops == [signal.SIGUSR1]
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is back
