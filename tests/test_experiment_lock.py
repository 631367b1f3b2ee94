"""One `rllib train` per experiment folder: a second run of the same --storage-path and --name, or a
--resume of a run still training, is refused naming the folder and the pid of the run that holds
it; a run killed with SIGKILL holds nothing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllib_dph.cli.experiments import EXPERIMENT_LOCK, PREFLIGHT_EXIT_CODE, hold_experiment
from rllib_dph.cli.main import main

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"model_name": "tiny-random", "max_response_length": 8, "group_size": 2, "prompts_per_step": 2,
          "env_config": {"data": "sql_synth/test"}}


def _train_args(storage: Path, *extra: str) -> list[str]:
    return ["train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0", "--config", json.dumps(CONFIG),
            "--stop", json.dumps({"training_iteration": 1000}), "--storage-path", str(storage), "--name", "exp", *extra]


@pytest.fixture
def training(tmp_path):
    """A real `rllib train` past its first iteration: (storage folder, its process)."""
    log = tmp_path / "first.log"
    proc = subprocess.Popen([sys.executable, "-m", "rllib_dph.cli", *_train_args(tmp_path)], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while "iter    1" not in log.read_text():
        assert proc.poll() is None, f"the run ended: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, "the run did not reach its first iteration"
        time.sleep(0.2)
    yield tmp_path, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_second_run_and_a_resume_of_a_running_one_are_refused(training, capsys, without_ray):
    storage, proc = training
    for extra in ((), ("--resume",)):
        with pytest.raises(SystemExit) as exit_info:
            main(_train_args(storage, *extra))
        assert exit_info.value.code == PREFLIGHT_EXIT_CODE
        err = capsys.readouterr().err
        assert f"the experiment folder {storage / 'exp'} is in use by another rllib train (pid {proc.pid} on " in err
        assert "give another --name" in err
    assert proc.poll() is None  # the first run goes on
    # SIGKILL: the kernel drops the dead holder's lock, the folder is free at once.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with hold_experiment(str(storage / "exp")):
        assert (storage / "exp" / EXPERIMENT_LOCK).read_text().startswith(f"pid {os.getpid()} on ")


def test_a_held_folder_is_refused_and_free_once_its_holder_is_killed(tmp_path, capsys, without_ray):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom rllib_dph.cli.experiments import hold_experiment\n"
         f"with hold_experiment({str(tmp_path / 'exp')!r}):\n    print('held', flush=True)\n    time.sleep(600)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as exit_info:
            main(_train_args(tmp_path, "--resume"))
        assert exit_info.value.code == PREFLIGHT_EXIT_CODE
        assert f"(pid {holder.pid} on " in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    with hold_experiment(str(tmp_path / "exp")):
        pass
