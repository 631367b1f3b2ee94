"""The one verifier isolation (rllib_dph.envs.isolation): limits, the one report of a failure,
the checker's import path, and the envs that run their verifiers in it."""

import ctypes
import math
import os
import signal
import sys
import threading
import time

import pytest

from rllib_dph.envs import forkserver, isolation
from rllib_dph.envs.arguments import ArgumentError
from rllib_dph.envs.base import Task, Verdict, VerifierEnv
from rllib_dph.envs.forkserver import ForkRefused, ForkServer
from rllib_dph.envs.isolation import IsolationFailure, IsolationSetupError, Limits, RemoteError
from rllib_dph.envs.sql import env as sql_env

WALL = Limits(wall_s=20.0, setting="verifier_timeout_s")


def _add(a, b, *, c=0):
    return a + b + c


def _pid():
    return os.getpid()


def _sleep(seconds):
    time.sleep(seconds)
    return "woke"


def _spin():
    while True:  # Python code: the CPU timer interrupts it
        pass


def _stuck_in_c():
    return sum(range(10**13))  # one C call: only a kill stops it


def _allocate(megabytes):
    return len(bytearray(megabytes << 20))


def _exit(code):
    sys.exit(code)


def _hard_exit():
    os._exit(7)


def _segfault():
    return ctypes.string_at(0)


class _Unpicklable(Exception):
    def __init__(self, first, second):  # pickle calls cls(*args): two arguments, one given back
        super().__init__(f"{first} and {second}")


def _raise(kind):
    if kind == "key":
        raise KeyError("boom")
    raise _Unpicklable("a", "b")


def _nested_pid():
    return os.getpid(), isolation.run(_pid, limits=WALL)


def _nested_cpu_limit():
    try:
        isolation.run(_spin, limits=Limits(cpu_s=0.3, wall_s=30.0, setting="inner_s"))
    except IsolationFailure as failure:
        return failure.reason
    return "no limit"


def _loaded(module):
    return module in sys.modules


def _import_file(name):
    return __import__(name).__file__


def test_a_call_runs_in_a_checker_subprocess_and_its_value_comes_back():
    assert isolation.run(_add, 1, 2, c=3, limits=WALL) == 6
    assert isolation.run(_pid, limits=WALL) != os.getpid()
    assert isolation.run(lambda x: x * 2, 21, limits=WALL) == 42  # a lambda travels by value
    assert isolation.run(_pid, limits=None) == os.getpid()  # no limits: in this thread


def test_the_wall_limit_kills_the_call_and_a_fresh_checker_takes_the_next():
    start = time.monotonic()
    with pytest.raises(IsolationFailure) as failure:
        isolation.run(_sleep, 60, limits=Limits(wall_s=0.3, setting="verifier_timeout_s"))
    assert failure.value.reason == "verifier timed out after 0.3 s (verifier_timeout_s)"
    assert time.monotonic() - start < 5.0
    assert isolation.run(_sleep, 0, limits=WALL) == "woke"


@pytest.mark.parametrize("fn", [_spin, _stuck_in_c], ids=["python", "c"])
def test_the_cpu_limit_counts_the_checkers_own_cpu_time(fn):
    limits = Limits(cpu_s=0.3, wall_s=30.0, setting="timeout_s", label="math check")
    with pytest.raises(IsolationFailure) as failure:
        isolation.run(fn, limits=limits)
    assert failure.value.reason == "math check timed out after 0.3 s of CPU time (timeout_s)"


def test_the_memory_limit_stops_an_allocation_past_it():
    limits = Limits(wall_s=20.0, memory_bytes=64 << 20)
    with pytest.raises(IsolationFailure, match=r"verifier ran out of memory \(more than 64 MiB"):
        isolation.run(_allocate, 512, limits=limits)
    assert isolation.run(_allocate, 16, limits=limits) == 16 << 20  # the same checker goes on


@pytest.mark.parametrize("limits", [WALL, None], ids=["checker", "this thread"])
def test_sys_exit_is_a_failure_never_an_exit(limits):
    with pytest.raises(IsolationFailure, match=r"^verifier called sys.exit\(3\)$"):
        isolation.run(_exit, 3, limits=limits)


@pytest.mark.parametrize("fn,how", [(_hard_exit, "exit code 7"), (_segfault, "killed by signal 11, SIGSEGV")])
def test_a_crashed_checker_is_reported_and_replaced(fn, how):
    with pytest.raises(IsolationFailure) as failure:
        isolation.run(fn, limits=WALL)
    assert failure.value.reason == f"verifier crashed: its process ended ({how})"
    assert isolation.run(_add, 1, 1, limits=WALL) == 2


def test_the_functions_exception_is_raised_here_with_its_type():
    with pytest.raises(KeyError, match="boom"):
        isolation.run(_raise, "key", limits=WALL)
    with pytest.raises(RemoteError) as error:
        isolation.run(_raise, "unpicklable", limits=WALL)
    assert isolation.exception_name(error.value) == "_Unpicklable" and str(error.value) == "a and b"


def test_what_cannot_be_pickled_is_a_setup_error_of_the_caller():
    lock = threading.Lock()
    with pytest.raises(IsolationSetupError, match="function .* cannot be sent to a checker subprocess"):
        isolation.run(lambda: lock, limits=WALL)
    with pytest.raises(IsolationSetupError, match="arguments of '_add' cannot be sent"):
        isolation.run(_add, lock, 1, limits=WALL)


def test_in_a_checker_calls_run_in_place_and_a_shorter_cpu_limit_applies():
    outer, inner = isolation.run(_nested_pid, limits=WALL)
    assert outer == inner != os.getpid()
    assert isolation.run(_nested_cpu_limit, limits=WALL) == "verifier timed out after 0.3 s of CPU time (inner_s)"


def test_the_checkers_import_path_ends_with_the_working_folder(tmp_path, monkeypatch):
    """A module in the caller's folder never shadows the standard library or an installed
    package in a checker; the caller's own modules there still load."""
    (tmp_path / "colorsys.py").write_text("raise SystemExit('the working folder shadowed colorsys')\n")
    (tmp_path / "my_verifier_module.py").write_text("def check(completion):\n    return completion == 'ok'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("")  # as `python -c` or an interactive session has it
    isolation._POOL.close()  # checkers start anew, from this folder
    assert isolation.run(_import_file, "colorsys", limits=WALL).startswith(os.path.dirname(os.__file__))
    import my_verifier_module

    assert isolation.run(my_verifier_module.check, "ok", limits=WALL) is True
    isolation._POOL.close()


@pytest.mark.parametrize("field,value", [("wall_s", math.inf), ("wall_s", math.nan), ("cpu_s", 0.0),
                                         ("memory_bytes", 10), ("grace_s", -1.0)])
def test_limits_are_checked(field, value):
    with pytest.raises(ArgumentError, match=f"Limits: {field}="):
        Limits(**{field: value})


# ----------------------------------------------------------------------------- a VerifierEnv subclass
class _Env(VerifierEnv):
    """A subclass with its own verifier method: it gets the isolation through ``step``."""

    def __init__(self, limits=Limits(wall_s=0.5, setting="verifier_timeout_s")):
        tasks = [Task("t0", "test", ({"role": "user", "content": "say ok"},), "ok")]
        super().__init__(tasks, self._verify, name="test/Subclass-v0", limits=limits)

    def _verify(self, completion, truth):
        if completion == "hang":
            time.sleep(60)
        if completion == "exit":
            sys.exit(0)
        if completion == "crash":
            os._exit(1)
        if completion == "nan":
            return Verdict(math.nan, True)
        if completion == "inf":
            return math.inf
        return completion == truth


@pytest.mark.parametrize(
    "completion,reward,correct,error",
    [
        ("ok", 1.0, True, None),
        ("no", 0.0, False, None),
        ("hang", 0.0, False, "verifier timed out after 0.5 s (verifier_timeout_s)"),
        ("exit", 0.0, False, "verifier called sys.exit(0)"),
        ("crash", 0.0, False, "verifier crashed: its process ended (exit code 1)"),
        ("nan", 0.0, False, "the verifier returned a non-finite reward (nan); scored 0"),
        ("inf", 0.0, False, "the verifier returned a non-finite reward (inf); scored 0"),
    ],
)
def test_a_verifier_env_subclass_runs_its_verifier_in_the_isolation(completion, reward, correct, error):
    env = _Env()
    env.reset(options={"index": 0})
    _, got, terminated, truncated, info = env.step(completion)
    assert (got, terminated, truncated, info["correct"], info.get("error")) == (reward, True, False, correct, error)
    assert math.isfinite(got) and isinstance(got, float)


def test_a_verifier_env_without_limits_scores_in_this_thread():
    env = _Env(limits=None)
    env.reset(options={"index": 0})
    assert env.step("exit")[4]["error"] == "verifier called sys.exit(0)"  # still never an exit


def test_a_verdict_with_a_reward_that_is_no_number_is_a_clear_error():
    env = VerifierEnv([Task("t0", "test", ({"role": "user", "content": "q"},), "a")],
                      lambda completion, truth: Verdict("1", True), name="test/Bad-v0")
    env.reset()
    with pytest.raises(TypeError, match=r"test/Bad-v0: the verifier's Verdict has reward='1' \(a str\)"):
        env.step("a")


# ----------------------------------------------------------------------------- the fork server
fork_server = pytest.mark.skipif(not forkserver.AVAILABLE, reason="fork servers need pidfds (Linux >= 5.3)")

_CHILD = '''
import os, sys, threading


def main(template_pid):
    """Answers each line of stdin with what the child sees; 'exit N' exits with N."""
    for line in sys.stdin:
        if line.startswith("exit"):
            os._exit(int(line.split()[1]))
        seen = [os.getppid() == template_pid, os.getcwd(), sys.path[0], os.environ.get("CHILD_MARK"),
                threading.active_count()]
        sys.stdout.write(repr(seen) + "\\n")
        sys.stdout.flush()
'''


def _ask(child, line):
    child.stdin.write(line.encode() + b"\n")
    child.stdin.flush()
    return eval(child.stdout.readline())


@fork_server
def test_a_forked_child_takes_the_callers_context_of_the_moment_and_reports_its_exit(tmp_path):
    (tmp_path / "child_entry.py").write_text(_CHILD)
    path = [str(tmp_path), *sys.path]
    server = ForkServer(["child_entry"], "child_entry:main", path, isolation._checker_env())
    try:
        first = server.fork(path, dict(os.environ, CHILD_MARK="one"), timeout=60.0)
        assert _ask(first, "hello") == [True, os.getcwd(), str(tmp_path), "one", 1]
        work = tmp_path / "work"
        work.mkdir()
        old = os.getcwd()
        os.chdir(work)
        try:
            second = server.fork(["/nowhere", *path], dict(os.environ, CHILD_MARK="two"), timeout=60.0)
        finally:
            os.chdir(old)
        assert _ask(second, "hello") == [True, str(work), "/nowhere", "two", 1]
        assert first.pid != second.pid and first.poll() is None
        first.stdin.write(b"exit 7\n")
        first.stdin.flush()
        assert first.wait(timeout=30.0) == 7 and first.stdout.read() == b""
        second.kill()
        assert second.wait(timeout=30.0) == -signal.SIGKILL
    finally:
        server.close()


@fork_server
def test_kill_after_close_sends_no_signal_to_a_reused_descriptor(tmp_path):
    """kill() after close() (a deadline racing the exit-time cleanup) neither raises nor signals
    whatever now holds the closed pidfd's number."""
    (tmp_path / "child_entry.py").write_text(_CHILD)
    path = [str(tmp_path), *sys.path]
    server = ForkServer(["child_entry"], "child_entry:main", path, isolation._checker_env())
    try:
        victim = server.fork(path, dict(os.environ), timeout=60.0)
        other = server.fork(path, dict(os.environ), timeout=60.0)
        victim.close()
        victim.kill()  # no EBADF, no signal through a number another descriptor may now hold
        assert _ask(other, "hello")[0] is True and other.poll() is None
        assert _ask(victim, "hello")[0] is True  # it was not killed either: its pidfd is gone
        victim.stdin.write(b"exit 0\n")
        victim.stdin.flush()
        other.kill()
        assert other.wait(timeout=30.0) == -signal.SIGKILL
    finally:
        server.close()


@fork_server
def test_the_children_end_with_the_fork_server(tmp_path):
    (tmp_path / "child_entry.py").write_text(_CHILD)
    path = [str(tmp_path), *sys.path]
    server = ForkServer(["child_entry"], "child_entry:main", path, isolation._checker_env())
    child = server.fork(path, dict(os.environ), timeout=60.0)
    assert _ask(child, "hello")[0] is True
    server.close()
    assert child.wait(timeout=30.0) == -signal.SIGKILL
    assert child.stdout.read() == b""  # ended: its end of the pipe is closed


@fork_server
def test_a_preload_that_starts_a_thread_makes_the_fork_server_refuse_to_fork(tmp_path):
    (tmp_path / "child_entry.py").write_text(_CHILD)
    (tmp_path / "threaded.py").write_text("import threading, time\n"
                                         "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    path = [str(tmp_path), *sys.path]
    server = ForkServer(["child_entry"], "child_entry:main", path, isolation._checker_env())
    try:
        server.preload("module", "json")  # no thread: forks go on
        assert _ask(server.fork(path, dict(os.environ), timeout=60.0), "hello")[0] is True
        server.preload("module", "threaded")
        with pytest.raises(ForkRefused, match=r"a preload \(module threaded\) started a thread"):
            for _ in range(300):  # the preload runs once the server is idle
                time.sleep(forkserver.PRELOAD_AFTER_IDLE_S + 0.1)
                server.fork(path, dict(os.environ), timeout=60.0).kill()
    finally:
        server.close()


@fork_server
def test_checkers_are_forked_from_the_fork_server_in_the_callers_context(tmp_path, monkeypatch):
    """A checker is a child of the fork server, which loaded the package's verifier modules; a
    checker forked later gets the working folder and environment of the moment."""
    isolation.run(_add, 1, 1, limits=WALL)
    server = isolation._POOL._server
    assert isolation.run(os.getppid, limits=WALL) == server.proc.pid
    isolation.run(sql_env._run_and_compare, "SELECT 1", "SELECT 1", str(tmp_path / "x.sqlite"), "bird", 5.0,
                  False, limits=WALL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHECKER_MARK", "later")
    isolation.set_checker_pool(idle_s=0.1)
    try:
        time.sleep(0.3)
        isolation._POOL.reap()  # the checkers go, the fork server stays
        assert isolation.run(os.getcwd, limits=WALL) == str(tmp_path)
        assert isolation.run(os.environ.get, "CHECKER_MARK", limits=WALL) == "later"
        assert isolation.run(os.getppid, limits=WALL) == server.proc.pid
        assert isolation.run(_loaded, "rllib_dph.envs.sql.env", limits=WALL) is True
    finally:
        isolation.set_checker_pool(idle_s=isolation.CHECKER_IDLE_S)


def test_without_a_fork_server_checkers_start_as_new_interpreters(monkeypatch):
    isolation._POOL.close()
    monkeypatch.setattr(isolation._POOL, "_server_failures", isolation.FORK_SERVER_FAILURES)
    try:
        assert isolation.run(os.getppid, limits=WALL) == os.getpid()
        with pytest.raises(IsolationFailure, match=r"verifier crashed: its process ended \(exit code 7\)"):
            isolation.run(_hard_exit, limits=WALL)
        assert isolation._POOL._server is None
    finally:
        isolation._POOL.close()
