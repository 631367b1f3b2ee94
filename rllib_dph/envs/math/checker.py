"""Math-Verify's ``parse`` + ``verify`` in a checker subprocess, under a CPU-time limit.

Math-Verify's own timeout uses ``signal.alarm``, which only works in the main thread. We switch it
off and run ``parse`` + ``verify`` in a *checker subprocess* instead (``python -m rllib_dph.envs.math.checker``),
reused across calls (a pipe round trip, ~0.2 ms). The checkers of a process form a bounded pool
(:func:`set_checker_pool`; default: one per CPU core, so 16 threads do not start 16 checkers
that share 2 cores); a thread waits for a free one, and idle checkers are stopped after
``CHECKER_IDLE_S``.

Time limits count the checker's own **CPU time**, so that a correct answer is not scored 0
because the machine is busy: an interval timer (``ITIMER_PROF``) interrupts a check once it has
used ``timeout_s`` CPU seconds. A check stuck in C code (``9^{9^{9^9}}`` computes a huge
integer) cannot be interrupted: the caller, which reads the checker's CPU time from ``/proc``,
kills it once it has used ``CHECKER_KILL_GRACE_S`` more. A checker silent for
``CHECKER_WALL_FACTOR * timeout_s`` wall seconds without having used its CPU budget (starved, or
stopped) is killed too, and the pair is checked once more on a fresh checker. Neither waiting for
a checker nor its start-up (~0.7 s, see :func:`start_checker`) is charged to ``timeout_s``. So a
check never hangs, from any thread or Ray actor, whatever the input (huge exponents, deep
nesting, malformed LaTeX). The checker caps its memory, and dies with its parent (Linux
``PR_SET_PDEATHSIG``; elsewhere at end-of-input, or by its CPU limit when stuck).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

from rllib_dph.envs.arguments import ArgumentError, check_real

logger = logging.getLogger(__name__)

#: Longest time a checker subprocess may take to start (import Math-Verify); not in ``timeout_s``.
CHECKER_START_LIMIT_S = 120.0
#: A checker that used this many CPU seconds beyond ``timeout_s`` is stuck in C code: killed.
CHECKER_KILL_GRACE_S = 0.5
#: A checker silent for ``CHECKER_WALL_FACTOR * timeout_s + CHECKER_KILL_GRACE_S`` wall seconds
#: without having used its CPU budget (starved by a busy machine, or stopped) is replaced and
#: the pair checked once more.
CHECKER_WALL_FACTOR = 10.0
#: Most checker subprocesses per process (default: the CPU cores this process may use); more
#: concurrent checks wait for a free one. See :func:`set_checker_pool`.
CHECKER_POOL_SIZE = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
    os.cpu_count() or 1
)
#: A checker idle for this many seconds is stopped (each holds ~80 MB).
CHECKER_IDLE_S = 60.0
#: Longest wait for a free checker (all ``size`` busy) or for a new one to be started; then the
#: check raises ``TimeoutError`` naming the pool (a check holds a checker for at most
#: ``CHECKER_WALL_FACTOR * timeout_s`` + grace, so only a stuck pool waits this long).
#: See :func:`set_checker_pool`.
CHECKER_WAIT_LIMIT_S = 1800.0
#: Address-space cap of a checker subprocess (pathological inputs could otherwise eat all memory).
CHECKER_MEMORY_BYTES = 1 << 30
#: CPU seconds beyond ``timeout_s`` after which a checker is killed by the kernel (when orphaned).
CHECKER_CPU_GRACE_S = 5
#: Ranges accepted by :func:`set_checker_pool`: more checkers than this is no pool (each holds
#: ~80 MB); an idle time below the lower bound would keep the service thread spinning, above the
#: upper one it is no limit.
MAX_CHECKER_POOL_SIZE = 256
CHECKER_IDLE_RANGE_S = (0.1, 86_400.0)
CHECKER_WAIT_RANGE_S = (0.01, 31_536_000.0)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


def _timed_out(timeout_s: float) -> str:
    return f"math check timed out after {timeout_s:g} s of CPU time"


class _CheckerTimeout(Exception):
    """A check ran out of time. ``stuck``: it used its CPU budget (else the wall-clock cap hit a
    checker that was starved of CPU or stopped)."""

    def __init__(self, stuck: bool):
        super().__init__("stuck" if stuck else "starved")
        self.stuck = stuck


class _CheckerDied(Exception):
    pass


class CheckerPoolTimeout(TimeoutError):
    """A check waited ``wait_s`` for a checker of the pool (:func:`set_checker_pool`). Not about
    the completion: the verifier lets it through to the training loop, which names the env runner."""


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` from ``/proc``; None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # fields from the 3rd (state) on
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime (14th, 15th)


class _Checker:
    """One checker subprocess (``python -m rllib_dph.envs.math.checker PARENT_PID``) and the JSON-lines protocol.

    Request: ``{"gold": str, "pred": str, "limit_s": float}``; reply: ``{"equal": bool,
    "error": str | null}``. The subprocess first writes ``{"ready": true}`` once it has imported
    Math-Verify.
    """

    def __init__(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rllib_dph.envs.math.checker", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
        )
        self.ready = False
        self._pending = b""

    def _read_message(self, deadline: float) -> dict | None:
        """Reads one JSON line; None when ``deadline`` passes first."""
        fd = self.proc.stdout.fileno()
        poller = select.poll()  # not select.select: that fails on fd numbers >= 1024
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _CheckerDied(f"exit code {self.proc.poll()}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def wait_ready(self) -> None:
        if self.ready:
            return
        if self._read_message(time.monotonic() + CHECKER_START_LIMIT_S) is None:
            raise _CheckerDied(f"did not start within {CHECKER_START_LIMIT_S:g} s")
        self.ready = True

    def _cpu_used(self, since_cpu: float | None, since_wall: float) -> float:
        """CPU seconds the checker used since ``since_cpu`` (wall seconds without /proc)."""
        now = _cpu_seconds(self.proc.pid) if since_cpu is not None else None
        return time.monotonic() - since_wall if now is None else now - since_cpu

    def check(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, str | None]:
        """Asks Math-Verify if ``pred`` equals ``gold``; raises _CheckerTimeout or _CheckerDied.

        ``timeout_s`` is the checker's own CPU time for this pair: a checker waiting for a busy
        CPU is not charged. One that used ``timeout_s + CHECKER_KILL_GRACE_S`` CPU seconds is
        stuck in C code; one silent for ``CHECKER_WALL_FACTOR * timeout_s + grace`` wall seconds
        is starved or stopped.
        """
        self.wait_ready()
        request = json.dumps({"gold": gold, "pred": pred, "limit_s": timeout_s}) + "\n"
        start_cpu, start = _cpu_seconds(self.proc.pid), time.monotonic()
        try:
            self.proc.stdin.write(request.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _CheckerDied(f"cannot send the request ({e})") from e
        wall_limit = start + CHECKER_WALL_FACTOR * timeout_s + CHECKER_KILL_GRACE_S
        while True:
            # The checker cannot use CPU faster than the clock runs: wait until it could have
            # used its budget, then look again.
            cpu_left = timeout_s + CHECKER_KILL_GRACE_S - self._cpu_used(start_cpu, start)
            if cpu_left <= 0 or time.monotonic() >= wall_limit:
                raise _CheckerTimeout(stuck=cpu_left <= 0)
            reply = self._read_message(min(time.monotonic() + cpu_left, wall_limit))
            if reply is not None:
                return bool(reply["equal"]), reply["error"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class _CheckerPool:
    """The checker subprocesses of this process: at most ``size``, shared by all threads.

    A thread takes an idle checker, else starts one while fewer than ``size`` exist, else waits
    for one (waiting is not charged to any ``timeout_s``). Checkers idle for ``idle_s`` are
    stopped. Checkers are started by one long-lived service thread, which also stops idle ones:
    a checker asks the kernel to kill it when the thread that started it ends (Linux
    ``PR_SET_PDEATHSIG``), so that thread must live as long as the process.
    """

    def __init__(self, size: int = CHECKER_POOL_SIZE, idle_s: float = CHECKER_IDLE_S, wait_s: float = CHECKER_WAIT_LIMIT_S):
        self.size = size
        self.idle_s = idle_s
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._idle: list[tuple[float, _Checker]] = []  # (released at, checker), last used last
        self._live: set[_Checker] = set()
        self._reserved = 0  # checkers being started
        self._next_ticket = self._serving = 0  # turns of the threads waiting for a checker
        self._abandoned: set[int] = set()  # turns of threads that stopped waiting (timed out)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # futures of new checkers
        self._service: threading.Thread | None = None
        self._parents_checkers: list[_Checker] = []  # see forget()

    def _serve_requests(self) -> None:
        """The service thread: starts the checkers asked for; stops idle ones now and then."""
        while True:
            try:
                future = self._requests.get(timeout=self.idle_s / 2)
            except queue.Empty:
                self.reap()
                continue
            try:
                future.set_result(_Checker())
            except BaseException as e:  # e.g. OSError: too many processes
                future.set_exception(e)

    def _spawn(self) -> _Checker:
        """Starts a checker (counted in ``_reserved`` by the caller until now)."""
        future: Future = Future()
        with self._cond:
            if self._service is None:
                self._service = threading.Thread(
                    target=self._serve_requests, name="math-checkers", daemon=True
                )
                self._service.start()
        self._requests.put(future)
        try:
            checker = future.result(timeout=self.wait_s)
        except TimeoutError as e:
            raise self._wait_timeout("a new checker subprocess to be started") from e
        finally:
            with self._cond:
                self._reserved -= 1
                self._cond.notify_all()
        with self._cond:
            self._live.add(checker)
        return checker

    def _acquire(self) -> _Checker:
        """An idle checker, else a new one while fewer than ``size`` exist, else waits its turn.

        Turns are served first come, first served (a ticket each): without them a thread that
        has just released a checker takes it back at once, and others starve for minutes. A
        thread waits at most ``wait_s``, then gives its turn up and raises ``TimeoutError``.
        """
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            while True:
                if ticket != self._serving:
                    self._wait_turn(ticket, deadline)
                elif self._idle:
                    checker = self._idle.pop()[1]
                    if checker.proc.poll() is None:
                        self._next_turn()
                        return checker
                    self._live.discard(checker)  # died while idle (e.g. killed from outside)
                elif len(self._live) + self._reserved < self.size:
                    self._reserved += 1
                    self._next_turn()
                    break
                else:
                    self._wait_turn(ticket, deadline)
        return self._spawn()

    def _wait_turn(self, ticket: int, deadline: float) -> None:
        """Waits (holding ``_cond``) for a change until ``deadline``; past it gives the turn up."""
        remaining = deadline - time.monotonic()
        if remaining > 0:
            self._cond.wait(remaining)
            return
        if ticket == self._serving:
            self._next_turn()
        else:
            self._abandoned.add(ticket)
        raise self._wait_timeout(f"a free checker (all {len(self._live)} busy)")

    def _wait_timeout(self, what: str) -> CheckerPoolTimeout:
        return CheckerPoolTimeout(
            f"math checker pool (size={self.size}): waited wait_s={self.wait_s:g} s for {what}. "
            "Checks hold a checker for a bounded time, so the pool is stuck or far too small for "
            "the threads checking: raise rllib_dph.envs.math.set_checker_pool(size=..., wait_s=...)."
        )

    def _next_turn(self) -> None:
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        self._cond.notify_all()

    def _release(self, checker: _Checker) -> None:
        with self._cond:
            self._idle.append((time.monotonic(), checker))
            self._cond.notify_all()

    def _retire(self, checker: _Checker) -> None:
        checker.kill()
        with self._cond:
            self._live.discard(checker)
            self._cond.notify_all()

    def reap(self) -> int:
        """Stops the checkers idle for more than ``idle_s``; returns how many."""
        now = time.monotonic()
        with self._cond:
            stale = [c for t, c in self._idle if now - t > self.idle_s]
            self._idle = [(t, c) for t, c in self._idle if now - t <= self.idle_s]
            self._live.difference_update(stale)
            self._cond.notify_all()
        for checker in stale:
            checker.kill()
        return len(stale)

    def check(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, str | None]:
        """Checks one pair in a checker subprocess, replacing the checker on timeout or crash.

        A checker that was starved or stopped (not one that used its CPU budget), or that died,
        is replaced and the pair checked once more.
        """
        tries = 2
        while True:
            tries -= 1
            checker = self._acquire()
            try:
                result = checker.check(gold, pred, timeout_s)
            except _CheckerTimeout as timeout:
                self._retire(checker)
                if timeout.stuck or tries == 0:
                    return False, _timed_out(timeout_s)
            except _CheckerDied as e:
                self._retire(checker)
                if tries == 0:
                    return False, f"math checker process died ({e})"
            except BaseException:
                self._retire(checker)  # e.g. KeyboardInterrupt mid-request: pipe state unknown
                raise
            else:
                self._release(checker)
                return result

    def warm_up(self) -> None:
        """Makes sure one started checker is idle in the pool."""
        checker = self._acquire()
        try:
            checker.wait_ready()
        except _CheckerDied:
            self._retire(checker)
            raise
        self._release(checker)

    def close(self) -> None:
        """Kills every checker subprocess (registered with ``atexit``)."""
        with self._cond:
            live, self._live, self._idle = list(self._live), set(), []
        for checker in live:
            checker.kill()

    def forget(self) -> None:
        """In a forked child: let go of the parent's checkers and start with none.

        Our copies of their pipes are closed so that they still see end-of-input when the parent
        exits; the Popen objects are kept (not our processes to wait for or warn about).
        """
        for checker in self._live:
            for stream in (checker.proc.stdin, checker.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        parents_checkers = list(self._live)
        self.__init__(self.size, self.idle_s, self.wait_s)
        self._parents_checkers = parents_checkers


_POOL = _CheckerPool()
atexit.register(_POOL.close)
os.register_at_fork(after_in_child=_POOL.forget)


def start_checker() -> None:
    """Starts a checker subprocess now and waits until it is ready (about 0.7 s).

    Optional: the first check that needs Math-Verify does it otherwise (not counted in its
    ``timeout_s``). Useful before timing checks, or to pay the start-up before training starts.

    Raises:
        RuntimeError: The checker could not start (e.g. ``math-verify`` is not installed).
    """
    try:
        _POOL.warm_up()
    except _CheckerDied as e:
        raise RuntimeError(f"the math checker subprocess did not start: {e}") from e


def set_checker_pool(*, size: int | None = None, idle_s: float | None = None, wait_s: float | None = None) -> None:
    """Sets the bounds of this process's checker pool. Lowering ``size`` stops no checker: no new
    one starts until fewer than ``size`` exist, and idle ones are stopped after ``idle_s``.

    Args:
        size: Most checker subprocesses at once, in [1, MAX_CHECKER_POOL_SIZE] (default: the
            number of CPU cores).
        idle_s: Seconds after which an idle checker is stopped, in CHECKER_IDLE_RANGE_S
            (default 60).
        wait_s: Longest wait of a check for a free checker, in CHECKER_WAIT_RANGE_S (default
            ``CHECKER_WAIT_LIMIT_S``, 1800); then the check raises ``TimeoutError`` naming the
            pool, this value and this setting.

    Raises:
        ArgumentError: ``size`` is not an int in [1, MAX_CHECKER_POOL_SIZE], or
            ``idle_s`` / ``wait_s`` not a number of seconds in CHECKER_IDLE_RANGE_S /
            CHECKER_WAIT_RANGE_S (NaN and infinity included: they would end the pool's service
            thread or overflow its waits).
    """
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or not (
            1 <= size <= MAX_CHECKER_POOL_SIZE
        ):
            raise ArgumentError(
                f"set_checker_pool: size={size!r} must be an int in [1, {MAX_CHECKER_POOL_SIZE}] "
                f"(checker subprocesses, ~80 MB each); e.g. size={CHECKER_POOL_SIZE} (the "
                "default: the CPU cores of this process)."
            )
    if idle_s is not None:
        low, high = CHECKER_IDLE_RANGE_S
        idle_s = check_real(idle_s, "idle_s", low=low, high=high, where="set_checker_pool",
                            default=CHECKER_IDLE_S)
    if wait_s is not None:
        low, high = CHECKER_WAIT_RANGE_S
        _POOL.wait_s = check_real(wait_s, "wait_s", low=low, high=high, where="set_checker_pool",
                                  default=CHECKER_WAIT_LIMIT_S)
    if size is not None:
        with _POOL._cond:
            _POOL.size = size
            _POOL._cond.notify_all()
    if idle_s is not None:
        _POOL.idle_s = idle_s



class _Interrupted(BaseException):
    """Raised in the checker by its interval timer; a BaseException so that Math-Verify's and
    SymPy's ``except Exception`` clauses let it through (like Math-Verify's own timeout)."""


def _interrupt(signum, frame):
    raise _Interrupted()


def _die_with_parent(parent_pid: int) -> None:
    """Asks the kernel to kill this process when its parent ends (Linux); exits at once if the
    parent has already gone."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: end-of-input and RLIMIT_CPU still end it
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _serve(parent_pid: int) -> None:
    """The checker subprocess: answers JSON-line requests on stdin until stdin closes."""
    import resource

    _die_with_parent(parent_pid)
    resource.setrlimit(resource.RLIMIT_AS, (CHECKER_MEMORY_BYTES, CHECKER_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file when the CPU limit hits
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # our timeout replaces theirs
    from math_verify import parse, verify

    gold_cache: dict[str, list] = {}

    def parsed(text: str) -> list:
        return parse("\\boxed{" + text + "}", parsing_timeout=None)

    def check(gold_text: str, pred_text: str) -> dict:
        gold = gold_cache.get(gold_text)
        if gold is None:
            gold = gold_cache[gold_text] = parsed(gold_text)
            if len(gold_cache) > 4096:
                gold_cache.pop(next(iter(gold_cache)))
        if not gold:
            return {"equal": False, "error": "Math-Verify cannot parse the gold answer"}
        pred = parsed(pred_text)
        if not pred:
            return {"equal": False, "error": "Math-Verify cannot parse the answer"}
        return {"equal": bool(verify(gold, pred, timeout_seconds=None)), "error": None}

    check("\\frac{1}{2}", "0.5")  # loads the LaTeX grammar before the first timed check
    signal.signal(signal.SIGPROF, _interrupt)
    replies = os.fdopen(os.dup(1), "w")  # the protocol's own handle on stdout;
    os.dup2(2, 1)  # stray prints of libraries go to stderr instead
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        limit_s = request["limit_s"]
        # An orphaned checker stuck in C code is ended by the kernel (SIGXCPU).
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_limit = math.ceil(usage.ru_utime + usage.ru_stime + limit_s) + CHECKER_CPU_GRACE_S
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, resource.RLIM_INFINITY))
        try:
            signal.setitimer(signal.ITIMER_PROF, limit_s)  # CPU time of this process
            try:
                reply = check(request["gold"], request["pred"])
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
        except _Interrupted:
            reply = {"equal": False, "error": _timed_out(limit_s)}
        except Exception as e:  # RecursionError, MemoryError, sympy errors, ...
            reply = {"equal": False, "error": f"Math-Verify failed: {type(e).__name__}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
