"""Checkpoints and pre-sampled files are written atomically: a save that fails or
is killed with SIGKILL midway leaves the previous checkpoint loadable, and a pre-sampling run killed
while writing leaves no D_pef file that a later run would trust."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

REPO = Path(__file__).resolve().parents[1]


def _weights(algo) -> dict:
    return algo.learner_group.get_state()["learner"]["rl_module"][DEFAULT_MODULE_ID]


def _assert_checkpoint_of(path: Path, iteration: int, weights: dict) -> None:
    """``path`` loads as an Algorithm at ``iteration`` with ``weights``, and nothing was left beside it."""
    from ray.rllib.algorithms.algorithm import Algorithm

    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")) == []
    restored = Algorithm.from_checkpoint(str(path))
    try:
        assert restored.iteration == iteration
        state = _weights(restored)
        for k, v in weights.items():
            torch.testing.assert_close(torch.as_tensor(state[k]), torch.as_tensor(v))
    finally:
        restored.stop()


def test_a_failed_save_leaves_the_previous_checkpoint(ray_session, tiny_grpo_config, tmp_path):
    algo = tiny_grpo_config.build_algo()
    checkpoint = tmp_path / "checkpoint"
    try:
        algo.train()
        algo.save_to_path(str(checkpoint))
        saved = {k: torch.as_tensor(v).clone() for k, v in _weights(algo).items()}
        algo.train()  # the weights move on; the next save is the one that fails
        real_save = algo.learner_group.save_to_path

        def save_then_fill_the_disk(path, **kwargs):
            real_save(path, **kwargs)  # the learner's files are written ...
            raise OSError(errno.ENOSPC, "No space left on device")  # ... then the disk is full

        algo.learner_group.save_to_path = save_then_fill_the_disk
        with pytest.raises(OSError, match="No space left"):
            algo.save_to_path(str(checkpoint))
    finally:
        algo.stop()
    _assert_checkpoint_of(checkpoint, 1, saved)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child exited with {proc.returncode} before {path.name}")
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s} s"
        time.sleep(0.2)


def _run_child(script: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env)


def _kill_9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def test_a_relative_checkpoint_path_is_taken_from_the_working_folder(ray_session, tiny_grpo_config, tmp_path,
                                                                       monkeypatch):
    """RLlib hands a relative path to pyarrow, which refuses it ("URI has empty scheme"); a
    run's relative output folder must not lose its checkpoint at the end."""
    from rllib_dph.algorithms.grpo import GRPO

    monkeypatch.chdir(tmp_path)
    algo = tiny_grpo_config.build_algo()
    try:
        algo.train()
        saved_at = algo.save_to_path("runs/checkpoint")
    finally:
        algo.stop()
    assert saved_at == str(tmp_path / "runs" / "checkpoint")
    assert GRPO.from_checkpoint(saved_at).iteration == 1


def test_a_save_killed_with_sigkill_leaves_the_previous_checkpoint(ray_session, tmp_path):
    """A driver killed (SIGKILL) while its Algorithm writes a checkpoint over the previous one:
    the previous one still loads, with its iteration count and weights."""
    checkpoint, ready = tmp_path / "checkpoint", tmp_path / "saving"
    proc = _run_child(f"""
        import pickle, time
        from pathlib import Path
        import ray
        from ray.rllib.core import DEFAULT_MODULE_ID
        from rllib_dph.algorithms.grpo import GRPOConfig

        ray.init(address={ray_session.get_runtime_context().gcs_address!r}, log_to_driver=False)
        algo = (  # conftest.tiny_grpo_config
            GRPOConfig()
            .environment("rllib_dph/SQL-v0", env_config={{"data": "sql_synth/test"}})
            .llm(model_name="tiny-random", max_response_length=16)
            .training(group_size=4, prompts_per_step=4, lr=1e-3, minibatch_size=8)
            .debugging(seed=0)
        ).build_algo()
        algo.train()
        algo.save_to_path({str(checkpoint)!r})
        weights = algo.learner_group.get_state()["learner"]["rl_module"][DEFAULT_MODULE_ID]
        Path({str(tmp_path / "weights.pkl")!r}).write_bytes(pickle.dumps(weights))
        algo.train()
        real_save = algo.learner_group.save_to_path

        def save_then_hang(path, **kwargs):
            real_save(path, **kwargs)  # half of the new checkpoint is on disk
            Path({str(ready)!r}).touch()
            time.sleep(600)

        algo.learner_group.save_to_path = save_then_hang
        algo.save_to_path({str(checkpoint)!r})
    """)
    try:
        _wait_for(ready, proc)
    finally:
        _kill_9(proc)
    import pickle

    from rllib_dph.files import remove_leftovers

    assert len(remove_leftovers(checkpoint)) == 1  # the killed save's folder, never read
    _assert_checkpoint_of(checkpoint, 1, pickle.loads((tmp_path / "weights.pkl").read_bytes()))


def test_presampling_killed_while_writing_d_pef_leaves_no_file_to_trust(tmp_path):
    from test_dph import _presample_config

    from rllib_dph.algorithms.dph.presample import EXP_FILE, PEF_FILE, presample_once

    out, ready = tmp_path / "presample", tmp_path / "writing"
    proc = _run_child(f"""
        import time
        from pathlib import Path
        import pyarrow.parquet as pq
        from test_dph import _presample_config
        from rllib_dph.algorithms.dph.presample import presample

        real_write = pq.write_table

        def write_then_hang(table, where, **kwargs):
            real_write(table, where, **kwargs)
            if Path(where).name.startswith(".d_pef.parquet."):  # the D_pef file's temporary file
                Path({str(ready)!r}).touch()
                time.sleep(600)

        pq.write_table = write_then_hang
        presample(_presample_config({str(out)!r}), progress=False)
    """)
    try:
        _wait_for(ready, proc)
    finally:
        _kill_9(proc)
    assert not (out / PEF_FILE).exists() and (out / EXP_FILE).exists()
    assert len(list(out.glob(".d_pef.parquet.*"))) == 1  # complete bytes, never renamed into place
    assert presample_once(_presample_config(out), progress=False)  # a later run samples again (resuming)
    assert pq.read_metadata(out / PEF_FILE).num_rows > 0 and not list(out.glob(".d_pef.parquet.*"))
