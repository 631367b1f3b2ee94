"""tools/offline_kit/gpu_suite.py's process handling: a step's clean-up kills what the step started, wherever
it went (Ray's daemons start their own sessions), and nothing else on the machine."""

import pathlib
import subprocess
import sys
import time

import pytest

@pytest.fixture(scope="module")
def suite(load_script):
    return load_script("tools/offline_kit/gpu_suite")


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not pathlib.Path("/proc/self/environ").exists(), reason="needs /proc")
def test_stop_kills_the_steps_detached_children_and_spares_other_processes(suite, tmp_path):
    # The step starts a child in a session of its own (as Ray's raylet is), prints its pid and waits.
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
              "print(p.pid, flush=True); time.sleep(120)")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    log = open(tmp_path / "step.log", "w+")
    try:
        proc = suite.launch([sys.executable, "-c", script], log)
        deadline = time.monotonic() + 30
        while not (pids := [int(x) for x in (tmp_path / "step.log").read_text().split() if x.isdigit()]):
            assert time.monotonic() < deadline, "the step never printed its child's pid"
            time.sleep(0.1)
        child = pids[0]
        assert child in suite.marked_pids(proc.marker) and bystander.pid not in suite.marked_pids(proc.marker)
        suite.stop(proc)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the step's detached child survived stop()"
        assert bystander.poll() is None, "stop() killed a process the step did not start"
    finally:
        bystander.kill()
        log.close()
