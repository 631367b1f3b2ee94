"""rllib_dph.files: atomic writes survive a kill -9 mid-write, locks time out naming their holder,
and one cache root serves models, suites and fingerprints."""

import ast
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rllib_dph import files

REPO = Path(__file__).resolve().parents[1]


def _start(script: str, ready: Path) -> subprocess.Popen:
    """Runs ``script`` in a fresh Python and waits until it has created ``ready``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, f"the writer exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "the writer never got going"
        time.sleep(0.05)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_write_is_all_or_nothing_under_kill_9(tmp_path):
    target, ready = tmp_path / "state.json", tmp_path / "ready"
    files.write_text_atomic(target, "old")
    proc = _start(f"""
        import time
        from pathlib import Path
        from rllib_dph.files import atomic_path
        with atomic_path({str(target)!r}) as tmp:
            tmp.write_text("half of the new")
            Path({str(ready)!r}).touch()
            time.sleep(120)
    """, ready)
    _kill(proc)
    assert target.read_text() == "old"
    leftovers = files.remove_leftovers(target)
    assert len(leftovers) == 1 and not leftovers[0].exists()
    files.write_text_atomic(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["ready", "state.json"]


def test_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    target = tmp_path / "sub" / "d_pef.parquet"
    files.write_bytes_atomic(target, b"v1")
    with pytest.raises(RuntimeError, match="disk full"):
        with files.atomic_path(target) as tmp:
            tmp.write_bytes(b"v2 partial")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"v1" and os.listdir(target.parent) == ["d_pef.parquet"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


def test_folder_replaced_whole_or_not_at_all_under_kill_9(tmp_path):
    target, ready = tmp_path / "model", tmp_path / "ready"
    with files.atomic_dir(target) as tmp:
        (tmp / "weights").write_text("v1")
        (tmp / "record.json").write_text("{}")
    proc = _start(f"""
        import time
        from pathlib import Path
        from rllib_dph.files import atomic_dir
        with atomic_dir({str(target)!r}) as tmp:
            (tmp / "weights").write_text("v2")
            Path({str(ready)!r}).touch()
            time.sleep(120)
    """, ready)
    _kill(proc)
    assert sorted(os.listdir(target)) == ["record.json", "weights"] and (target / "weights").read_text() == "v1"
    assert len(list(tmp_path.glob(".model.writing-*"))) == 1  # the killed writer's folder
    with files.atomic_dir(target) as tmp:  # the next writer removes it
        (tmp / "weights").write_text("v3")
    assert os.listdir(target) == ["weights"] and (target / "weights").read_text() == "v3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "ready"]


def test_failed_folder_write_keeps_the_old_folder(tmp_path):
    target = tmp_path / "checkpoint"
    with files.atomic_dir(target) as tmp:
        (tmp / "state.pkl").write_bytes(b"1")
    with pytest.raises(OSError):
        with files.atomic_dir(target) as tmp:
            (tmp / "state.pkl").write_bytes(b"2")
            raise OSError(28, "No space left on device")
    assert (target / "state.pkl").read_bytes() == b"1" and os.listdir(tmp_path) == ["checkpoint"]


def test_lock_timeout_names_the_lock_the_holder_and_the_timeout(tmp_path):
    lock, ready = tmp_path / "x.lock", tmp_path / "ready"
    proc = _start(f"""
        import time
        from pathlib import Path
        from rllib_dph.files import file_lock
        with file_lock({str(lock)!r}):
            Path({str(ready)!r}).touch()
            time.sleep(120)
    """, ready)
    try:
        started = time.monotonic()
        with pytest.raises(files.LockTimeout) as info:
            with files.file_lock(lock, timeout_s=0.5, what="the build of model 'tiny-random'"):
                pass
        assert 0.5 <= time.monotonic() - started < 10
        message = str(info.value)
        assert str(lock) in message and f"pid {proc.pid}" in message and "0.5 s" in message
        assert "tiny-random" in message
    finally:
        _kill(proc)
    with files.file_lock(lock, timeout_s=5):  # a killed holder's lock is free at once
        assert "pid" in lock.read_text() and str(os.getpid()) in lock.read_text()


def test_a_waiting_lock_says_at_once_and_every_few_minutes_what_it_waits_for(tmp_path, capsys):
    lock, ready = tmp_path / "x.lock", tmp_path / "ready"
    proc = _start(f"""
        import time
        from pathlib import Path
        from rllib_dph.files import file_lock
        with file_lock({str(lock)!r}):
            Path({str(ready)!r}).touch()
            time.sleep(120)
    """, ready)
    try:
        reports = []
        with pytest.raises(files.LockTimeout):
            with files.file_lock(lock, timeout_s=1.0, what="a pre-sampling run", report=reports.append,
                                 report_every_s=0.3):
                pass
        assert 3 <= len(reports) <= 5, reports
        for report in reports:
            assert f"waiting for the lock {lock} (a pre-sampling run), held by pid {proc.pid} on " in report
        assert "waited 0 s of 1 s" in reports[0]
        with pytest.raises(files.LockTimeout):  # by default on stderr, at once
            with files.file_lock(lock, timeout_s=0.2):
                pass
        assert f"rllib_dph: waiting for the lock {lock}, held by pid {proc.pid} on " in capsys.readouterr().err
    finally:
        _kill(proc)


@pytest.mark.parametrize("bad", [-1.0, math.nan])
def test_lock_refuses_a_bad_timeout(tmp_path, bad):
    with pytest.raises(ValueError, match="timeout_s"):
        with files.file_lock(tmp_path / "x.lock", timeout_s=bad):
            pass


def test_one_cache_root_for_models_suites_and_fingerprints(monkeypatch, tmp_path):
    from rllib_dph.envs import suites
    from rllib_dph.models import hub

    monkeypatch.setenv(files.HOME_ENV_VAR, str(tmp_path))
    monkeypatch.delenv("RLLIB_DPH_DATA", raising=False)
    assert files.home() == tmp_path
    assert suites.suite_root() == tmp_path / "suites" / "v1"
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "models" / "tiny-random"))):
        hub.resolve_model("tiny-random")
    monkeypatch.delenv(files.HOME_ENV_VAR)
    assert files.home() == Path.home() / ".cache" / "rllib_dph"


def test_files_module_is_a_leaf():
    """rllib_dph.envs imports rllib_dph.files, so it must import nothing of either package (no cycle)."""
    tree = ast.parse((REPO / "rllib_dph" / "files.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert all(name.split(".")[0] in sys.stdlib_module_names for name in names), names
