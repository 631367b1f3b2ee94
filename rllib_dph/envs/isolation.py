"""The one verifier isolation: a verifier call runs in a checker subprocess, under limits.

Every verifier goes through :func:`run`: the SQL verifier, the math verifier, reasoning-gym's
scorers, the functions registered with ``register_verifier_env`` and the tools of
``register_multiturn_env``, and the verifier of every :class:`~rllib_dph.envs.base.VerifierEnv`
subclass (its ``step`` calls it here, under the env's :attr:`~rllib_dph.envs.base.VerifierEnv.limits`).

Contract of ``run(fn, *args, limits=Limits(...), **kwargs)``:

- ``fn(*args, **kwargs)`` runs in a *checker*, a subprocess of this process, and its value comes
  back (pickled). The function is pickled with ``cloudpickle`` at its first call (a module-level
  function by reference, a lambda or closure by value) and sent to each checker once; a change
  to it (or to the object it is a method of) after its first call does not reach the checkers.
- **Limits** (:class:`Limits`), counted from the moment the checker has loaded the call (its
  modules imported, ``prepare`` run), so that neither a checker's start-up nor an import is
  charged: ``wall_s`` wall-clock seconds (plus ``grace_s``), ``cpu_s`` seconds of the checker's
  own CPU time (an interval timer interrupts Python code; a checker stuck in C code is killed
  :data:`CHECKER_KILL_GRACE_S` later; one that reached its wall limit without having used its CPU
  budget was starved, and the call is made once more on a fresh checker), and ``memory_bytes``
  of address space beyond what the checker holds when the call starts.
- **One report** for everything that stops a call: :class:`IsolationFailure`, whose ``reason``
  names the limit or the crash, e.g. ``verifier timed out after 0.2 s (verifier_timeout_s)``,
  ``verifier timed out after 5 s of CPU time (timeout_s)``, ``verifier ran out of memory (more
  than 2048 MiB beyond the checker's own)``, ``verifier called sys.exit(3)``, ``verifier crashed:
  its process ended (killed by signal 11, SIGSEGV)``. The envs turn it into reward 0 with the
  reason in ``info["error"]`` (:meth:`~rllib_dph.envs.base.VerifierEnv.score`). A checker that was
  killed is replaced at once in the background.
- An exception raised by ``fn`` is raised again here (its type and message kept; one that cannot
  be pickled arrives as :class:`RemoteError`). A function or argument that cannot be pickled, or
  a function whose module the checker cannot import, raises :class:`IsolationSetupError` (a
  TypeError of the caller, never a reward).
- ``limits=None``: ``fn`` runs in the calling thread without limits (``sys.exit`` still becomes an
  :class:`IsolationFailure`). Inside a checker every call runs in place, under the limits of the
  call that holds the checker (a shorter ``cpu_s`` of the inner call applies too).

The checkers of a process form a bounded pool (:func:`set_checker_pool`; default
:data:`CHECKER_POOL_SIZE`): a thread takes an idle checker, starts one while fewer than ``size``
exist, else waits its turn (first come, first served; not charged to any limit; past ``wait_s``
it raises :class:`CheckerPoolTimeout`). Idle checkers are stopped after ``idle_s``.

A checker starts without an interpreter start or imports: it is forked from the pool's fork
server (:mod:`rllib_dph.envs.forkserver`), a process started once that has imported what
checkers need (this module, with the envs package, gymnasium and NumPy) and, once idle, the
modules of this package's verifier functions called so far (and run their ``prepare``); the
checker takes the caller's working folder, import path and environment of the moment. Where fork
servers cannot run (no pidfds: macOS, Linux before 5.3), after :data:`FORK_SERVER_FAILURES` fork
servers failed, or once the fork server refuses to fork (a preload left a thread in it), a checker
starts as a new interpreter (``python -P``): the same checker, with a slower start. A checker
dies with its parent, the fork server or this process (Linux ``PR_SET_PDEATHSIG``; the fork
server dies with this process; else at end-of-input or by its CPU limit), writes no core file,
runs in the caller's folder with the caller's import path except that the working folder comes
*last* (a ``json.py`` or ``sympy.py`` there never shadows the real module), and its stray
prints go to stderr. It isolates hangs, crashes and memory; it is no security sandbox: a verifier
runs with this process's rights.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable

from rllib_dph.envs import forkserver
from rllib_dph.envs.arguments import ArgumentError, check_real
from rllib_dph.envs.forkserver import ForkRefused, ForkServer

#: Longest time a checker may take to start, or to load a call (import its modules, run its
#: ``prepare``); not charged to the call's limits. Past it the call fails as a crash.
CHECKER_START_LIMIT_S = 120.0
#: A checker that used this many CPU seconds beyond ``cpu_s`` is stuck in C code: killed.
CHECKER_KILL_GRACE_S = 0.5
#: CPU seconds beyond the call's limits after which the kernel ends a checker (``RLIMIT_CPU``:
#: the backstop of an orphaned checker stuck in C code).
CHECKER_CPU_GRACE_S = 5
#: Most checkers per process by default: the CPU cores this process may use, at least 4.
CHECKER_POOL_SIZE = max(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
    os.cpu_count() or 1))
#: A checker idle for this many seconds is stopped.
CHECKER_IDLE_S = 60.0
#: Longest wait for a free checker (or for a new one to start); then :class:`CheckerPoolTimeout`.
CHECKER_WAIT_LIMIT_S = 1800.0
#: Ranges accepted by :func:`set_checker_pool`.
MAX_CHECKER_POOL_SIZE = 256
CHECKER_IDLE_RANGE_S = (0.1, 86_400.0)
CHECKER_WAIT_RANGE_S = (0.01, 31_536_000.0)
#: Address space a call may add to what its checker holds, unless its limits say otherwise.
DEFAULT_MEMORY_BYTES = 2 << 30
#: Largest value a call may send back, pickled; a larger one fails as the call's exception.
MAX_REPLY_BYTES = 256 << 20
#: Functions (and ``prepare`` functions) each checker keeps loaded, least recently used first out.
CHECKER_FUNCTIONS = 64

#: What the fork server imports before it forks checkers (what every checker needs).
TEMPLATE_MODULES = ("rllib_dph.envs.isolation", "cloudpickle", "ctypes", "resource")
#: Fork servers that may fail (end, or not answer) in a process before its checkers are started
#: as new interpreters for good.
FORK_SERVER_FAILURES = 3

_FRAME = forkserver.FRAME  # length prefix of a pickled message between the processes
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: True in a checker: calls run in place.
_IN_CHECKER = False


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits of a call in the isolation (module docstring).

    Attributes:
        wall_s: Wall-clock seconds; None: no wall limit.
        cpu_s: Seconds of the checker's own CPU time; None: no CPU limit.
        memory_bytes: Address space the call may add to what the checker holds.
        grace_s: Wall seconds added to ``wall_s`` before the checker is killed (time for the
            call's own deadline to stop it first); reasons name ``wall_s``.
        setting: The argument that sets the limit, named in the reason (``"timeout_s"``).
        label: What the call is, the subject of the reason (``"verifier"``, ``"tool"``).
        prepare: A picklable function run once per checker before its first call under these
            limits (imports, a warm-up), not charged to them.
    """

    wall_s: float | None = None
    cpu_s: float | None = None
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    grace_s: float = 0.0
    setting: str = "verifier_timeout_s"
    label: str = "verifier"
    prepare: Callable[[], Any] | None = None

    def __post_init__(self):
        for name in ("wall_s", "cpu_s"):
            value = getattr(self, name)
            if value is not None:
                check_real(value, name, low=0.001, high=1e6, where="Limits", default=None)
        check_real(self.grace_s, "grace_s", low=0.0, high=3600.0, where="Limits", default=0.0)
        check_real(self.memory_bytes, "memory_bytes", low=1 << 20, high=1 << 50, where="Limits",
                   default=DEFAULT_MEMORY_BYTES)

    def timed_out(self, cpu: bool) -> str:
        """The reason of a call stopped by its wall (``cpu=False``) or CPU limit."""
        if cpu:
            return f"{self.label} timed out after {self.cpu_s:g} s of CPU time ({self.setting})"
        return f"{self.label} timed out after {self.wall_s:g} s ({self.setting})"


class IsolationFailure(Exception):
    """A call stopped by a limit or a crash (module docstring); ``reason`` says which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class IsolationSetupError(TypeError):
    """The call cannot run in a checker: its function or arguments cannot be pickled, or the
    checker cannot load them. A caller error, never a reward."""


class RemoteError(Exception):
    """An exception of the called function that could not be pickled back: ``type_name`` and
    its message."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name


class CheckerPoolTimeout(TimeoutError):
    """A call waited ``wait_s`` for a checker of the pool (:func:`set_checker_pool`). Not about
    the completion: the envs let it through to the training loop, which names the env runner."""


def exception_name(error: BaseException) -> str:
    """The type name of an exception, the original one for a :class:`RemoteError`."""
    return error.type_name if isinstance(error, RemoteError) else type(error).__name__


def run(fn: Callable[..., Any], *args: Any, limits: Limits | None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a checker under ``limits`` (module docstring).

    Raises:
        IsolationFailure: A limit stopped the call, or its process crashed or called sys.exit.
        IsolationSetupError: ``fn`` or its arguments cannot be sent to a checker or loaded there.
        CheckerPoolTimeout: No checker was free within the pool's ``wait_s``.
        Exception: Whatever ``fn`` raised.
    """
    if limits is None or _IN_CHECKER:
        return _run_here(fn, args, kwargs, limits)
    return _POOL.run(_Request(fn, args, kwargs, limits))


# ----------------------------------------------------------------------------- in this process
class _Interrupted(BaseException):
    """Raised by the CPU timer; a BaseException, so that ``except Exception`` clauses of the
    called code (Math-Verify's, SymPy's) let it through."""


def _interrupt(signum, frame):
    raise _Interrupted()


def _run_here(fn, args, kwargs, limits: Limits | None) -> Any:
    """``fn`` in this thread. In a checker's main thread a ``cpu_s`` shorter than what is left of
    the running call's CPU budget applies (the outer timer resumes after it)."""
    _prepare_here(limits.prepare if limits is not None else None)
    outer = signal.getitimer(signal.ITIMER_PROF)[0] if _IN_CHECKER and _main_thread() else 0.0
    inner = limits is not None and limits.cpu_s is not None and _IN_CHECKER and _main_thread() and (
        outer == 0.0 or limits.cpu_s < outer)
    if inner:
        used = _own_cpu_seconds()
        signal.setitimer(signal.ITIMER_PROF, limits.cpu_s)
    try:
        return fn(*args, **kwargs)
    except _Interrupted:
        if inner:
            raise IsolationFailure(limits.timed_out(cpu=True)) from None
        raise
    except SystemExit as exit_:
        label = limits.label if limits is not None else "verifier"
        raise IsolationFailure(f"{label} called sys.exit({exit_.code!r})") from None
    finally:
        if inner:
            left = outer - (_own_cpu_seconds() - used) if outer else 0.0
            signal.setitimer(signal.ITIMER_PROF, max(left, 0.001) if outer else 0.0)


_PREPARED: set[bytes] = set()


def _prepare_here(prepare: Callable[[], Any] | None) -> None:
    """Runs ``prepare`` once per process (keyed by its pickle)."""
    if prepare is None:
        return
    key = pickle.dumps(prepare)
    if key not in _PREPARED:
        prepare()
        _PREPARED.add(key)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


# ----------------------------------------------------------------------------- requests
_function_keys = iter(range(1, sys.maxsize))
#: Function -> (key, pickled function), for the functions that can be weakly referenced.
_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FUNCTIONS_LOCK = threading.Lock()


def _pickled(obj: Any, what: str) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(obj)
    except Exception as error:
        raise IsolationSetupError(
            f"the {what} cannot be sent to a checker subprocess ({type(error).__name__}: {error}); "
            "make it picklable (a module-level function, or one whose closure holds no lock, file "
            "or connection), or run it without isolation (limits=None, e.g. "
            "verifier_timeout_s=None for a registered verifier)."
        ) from error


def _function_payload(fn: Callable) -> tuple[int, bytes]:
    """``(key, pickled fn)``, pickled once per function object where it can be weakly
    referenced (else at every call, under a new key)."""
    with _FUNCTIONS_LOCK:
        try:
            known = _FUNCTIONS.get(fn)
        except TypeError:  # unhashable or not weakly referenceable
            known = None
        if known is not None:
            return known
    payload = (next(_function_keys), _pickled(fn, f"function {getattr(fn, '__qualname__', fn)!r}"))
    with _FUNCTIONS_LOCK:
        try:
            _FUNCTIONS[fn] = payload
        except TypeError:
            pass
    return payload


class _Request:
    """A call, pickled for the checkers: its function (keyed), arguments and limits."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, limits: Limits):
        self.limits = limits
        self.function = _function_payload(fn)
        self.prepare = None if limits.prepare is None else _function_payload(limits.prepare)
        self.arguments = _pickled((args, kwargs), f"arguments of {getattr(fn, '__qualname__', fn)!r}")
        #: What the fork server loads for later checkers: the module of a function of this
        #: package, and a ``prepare`` of this package (run there too).
        self.preloads = tuple(preload for preload, ours in (
            (("module", getattr(fn, "__module__", None)), _ours(fn)),
            (("call", self.prepare and self.prepare[1]), _ours(limits.prepare))) if ours)

    def frame(self, loaded: "OrderedDict[int, None]") -> bytes:
        """The request for a checker that holds the functions ``loaded``: a function it does not
        hold is sent with its pickle (``prepare`` always is: a checker runs it once per key)."""
        def part(payload):
            return None if payload is None else (payload[0], None if payload[0] in loaded else payload[1])

        cpu_s = self.limits.cpu_s
        budget = None if cpu_s is None and self.limits.wall_s is None else (
            cpu_s if cpu_s is not None else self.limits.wall_s + self.limits.grace_s)
        message = (part(self.function), self.prepare, self.arguments, cpu_s, budget,
                   self.limits.memory_bytes)
        data = pickle.dumps(message)
        return _FRAME.pack(len(data)) + data

    def mark_loaded(self, loaded: "OrderedDict[int, None]") -> None:
        """Records that the checker now holds the function (its own cache evicts the same ones)."""
        _touch(loaded, self.function[0])


def _ours(fn: Callable | None) -> bool:
    """Whether ``fn`` is a function of this package (whose modules are safe to load in the fork
    server: they start no thread)."""
    module = getattr(fn, "__module__", None) or ""
    return module.startswith("rllib_dph.") and module != __name__


def _touch(cache: OrderedDict, key: Any, value: Any = None) -> None:
    """Puts ``key`` last in the LRU ``cache`` and drops the oldest beyond CHECKER_FUNCTIONS."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CHECKER_FUNCTIONS:
        cache.popitem(last=False)


# ----------------------------------------------------------------------------- the checker side
_BOOT = ("import sys; sys.path[:] = sys.argv[2].split('\\n'); "
         "from rllib_dph.envs.isolation import _serve; _serve(int(sys.argv[1]))")


def _serve(parent_pid: int) -> None:
    """A checker: answers the calls read on stdin until stdin closes (protocol of
    :class:`_Checker`); its own stdout goes to stderr, so that stray prints cannot mix with the
    replies."""
    import resource

    global _IN_CHECKER
    _IN_CHECKER = True
    forkserver.die_with_parent(parent_pid)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file when a limit ends it
    signal.signal(signal.SIGPROF, _interrupt)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    functions: OrderedDict = OrderedDict()  # key -> function, as the parent's mirror of it
    prepared: set[int] = set()

    def reply(message: tuple) -> None:
        data = pickle.dumps(message)
        replies.write(_FRAME.pack(len(data)) + data)
        replies.flush()

    reply(("ready",))
    requests = sys.stdin.buffer
    while True:
        header = requests.read(_FRAME.size)
        if len(header) < _FRAME.size:
            return  # the parent closed the pipe
        message = pickle.loads(requests.read(_FRAME.unpack(header)[0]))
        loaded = _load(message, functions, prepared)
        if isinstance(loaded, tuple):
            reply(loaded)
            continue
        reply(("started",))
        reply(_call(loaded, *message[2:]))


def _load(message: tuple, functions: OrderedDict, prepared: set[int]) -> Any:
    """The function of a request, its ``prepare`` run first; ``("load", reason)`` on failure."""
    (key, data), prepare = message[0], message[1]
    try:
        fn = functions[key] if data is None else pickle.loads(data)
        if prepare is not None and prepare[0] not in prepared:
            pickle.loads(prepare[1])()
            prepared.add(prepare[0])
    except BaseException as error:  # e.g. the verifier's module is not importable here
        return ("load", f"{type(error).__name__}: {error}")
    _touch(functions, key, fn)
    return fn


def _call(fn: Callable, arguments: bytes, cpu_s: float | None, budget: float | None,
          memory_bytes: int) -> tuple:
    """Runs one call under its limits; the reply (``ok``, ``raised``, ``cpu``, ``memory`` or
    ``exit``)."""
    import cloudpickle

    restore = _set_limits(budget, memory_bytes)
    try:
        args, kwargs = pickle.loads(arguments)
        if cpu_s is not None:
            signal.setitimer(signal.ITIMER_PROF, cpu_s)
        try:
            value = fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        data = cloudpickle.dumps(value)
        if len(data) > MAX_REPLY_BYTES:
            raise ValueError(f"the value is {len(data)} bytes pickled, more than the isolation sends "
                             f"back ({MAX_REPLY_BYTES}); return less")
        return ("ok", data)
    except _Interrupted:
        return ("cpu",)
    except MemoryError:
        return ("memory",)
    except SystemExit as exit_:
        return ("exit", repr(exit_.code))
    except BaseException as error:  # the function's own exception, sent back to be raised there
        try:
            data = cloudpickle.dumps(error)
        except Exception:
            data = None
        return ("raised", type(error).__name__, str(error)[:2000], data)
    finally:
        restore()


def _set_limits(budget: float | None, memory_bytes: int) -> Callable[[], None]:
    """Sets this checker's address-space limit to its size now plus ``memory_bytes``, and its
    CPU-time limit (the kernel's backstop) to the CPU used so far plus ``budget`` plus
    CHECKER_CPU_GRACE_S; returns the function that restores both."""
    import math
    import resource

    saved = {limit: resource.getrlimit(limit) for limit in (resource.RLIMIT_AS, resource.RLIMIT_CPU)}

    def capped(limit, soft):
        hard = saved[limit][1]
        soft = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
        resource.setrlimit(limit, (soft, hard))

    try:
        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        capped(resource.RLIMIT_AS, size + memory_bytes)
    except (OSError, ValueError):  # no /proc: no memory limit
        pass
    if budget is not None:
        capped(resource.RLIMIT_CPU, math.ceil(_own_cpu_seconds() + budget) + CHECKER_CPU_GRACE_S)

    def restore() -> None:
        for limit, values in saved.items():
            resource.setrlimit(limit, values)

    return restore


# ----------------------------------------------------------------------------- the caller side
class _Died(Exception):
    """The checker ended, or did not start or load a call in time (the message says how)."""


class _Stopped(Exception):
    """A checker past a limit of its call (killed). ``cpu``: it used its CPU budget; else the wall
    limit hit, ``starved`` when a CPU budget was left unused."""

    def __init__(self, cpu: bool, starved: bool):
        super().__init__("cpu" if cpu else "starved" if starved else "wall")
        self.cpu, self.starved = cpu, starved


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` from ``/proc``; None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # fields from the 3rd (state) on
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime (14th, 15th)


def _checker_env() -> dict[str, str]:
    """This process's environment for a checker: one thread per numerical library."""
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _checker_path() -> list[str]:
    """This process's import path for a checker: absolute, the working folder (``''``) and the
    folder of the script that started this process last."""
    cwd = os.getcwd()
    script = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else cwd
    last = {cwd, script}
    entries = list(dict.fromkeys(os.path.abspath(p) if p else cwd for p in sys.path))
    return [p for p in entries if p not in last] + [p for p in entries if p in last]


class _Checker:
    """One checker subprocess and its protocol: length-prefixed pickles both ways.

    The checker writes ``("ready",)`` once started. A request is ``((key, function pickle or
    None), (key, prepare pickle) or None, arguments pickle, cpu_s, budget, memory_bytes)``; the
    checker answers ``("started",)`` once it has loaded it (or ``("load", reason)``), then one of
    ``("ok", value pickle)``, ``("raised", type name, message, exception pickle or None)``,
    ``("cpu",)``, ``("memory",)``, ``("exit", code)``.
    """

    def __init__(self, server: ForkServer | None = None):
        """Forks the checker from ``server``, else starts it as a new interpreter.

        Raises:
            ForkRefused: ``server`` did not fork it.
        """
        if server is not None:
            self.proc = server.fork(_checker_path(), _checker_env(), CHECKER_START_LIMIT_S)
        else:
            flags = ["-P"] if sys.version_info >= (3, 11) else []  # no working folder on the path
            self.proc = subprocess.Popen(
                [sys.executable, *flags, "-c", _BOOT, str(os.getpid()), "\n".join(_checker_path())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_checker_env(),
                start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
            )
        self.ready = False
        self.loaded: OrderedDict[int, None] = OrderedDict()  # the checker's functions, mirrored
        self.prepared: set[int] = set()  # keys of the prepare functions it ran
        self._pending = bytearray()

    def _read(self, deadline: float) -> tuple | None:
        """Reads one message; None when ``deadline`` passes first."""
        fd = self.proc.stdout.fileno()
        poller = select.poll()  # not select.select: that fails on fd numbers >= 1024
        poller.register(fd, select.POLLIN)
        while True:
            if len(self._pending) >= _FRAME.size:
                end = _FRAME.size + _FRAME.unpack_from(self._pending)[0]
                if len(self._pending) >= end:
                    message = pickle.loads(self._pending[_FRAME.size:end])
                    del self._pending[:end]
                    return message
            remaining = min(deadline - time.monotonic(), 60.0)
            if remaining <= 0 or not poller.poll(remaining * 1000):
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise _Died(self._how_it_ended())
            self._pending += chunk

    def _how_it_ended(self) -> str:
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "it closed its output"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else "?"
            return f"killed by signal {-code}, {name}"
        return f"exit code {code}"

    def wait_ready(self) -> None:
        if not self.ready:
            if self._read(time.monotonic() + CHECKER_START_LIMIT_S) is None:
                raise _Died(f"it did not start within {CHECKER_START_LIMIT_S:g} s")
            self.ready = True

    def call(self, request: _Request) -> tuple:
        """Sends ``request`` and returns the reply; raises _Died or _Stopped (the checker must
        then be killed). The limits count from the send when the checker holds the call's
        functions already, else from its ``started``."""
        self.wait_ready()
        loading = request.function[0] not in self.loaded or (
            request.prepare is not None and request.prepare[0] not in self.prepared)
        try:
            self.proc.stdin.write(request.frame(self.loaded))
            self.proc.stdin.flush()
        except OSError as error:
            raise _Died(f"it did not take the call ({error})") from None
        if loading:
            loaded = self._read(time.monotonic() + CHECKER_START_LIMIT_S)
            if loaded is None:
                raise _Died(f"it did not load the call within {CHECKER_START_LIMIT_S:g} s")
            if loaded[0] == "load":
                return loaded
            request.mark_loaded(self.loaded)
            if request.prepare is not None:
                self.prepared.add(request.prepare[0])
        return self._await(request.limits)

    def _await(self, limits: Limits) -> tuple:
        """The reply of the started call, within its limits; raises _Stopped past them."""
        start_cpu, start = _cpu_seconds(self.proc.pid), time.monotonic()
        wall = float("inf") if limits.wall_s is None else start + limits.wall_s + limits.grace_s
        while True:
            cpu_left = float("inf")
            if limits.cpu_s is not None:  # it cannot use CPU faster than the clock runs
                now_cpu = _cpu_seconds(self.proc.pid) if start_cpu is not None else None
                used = time.monotonic() - start if now_cpu is None else now_cpu - start_cpu
                cpu_left = limits.cpu_s + CHECKER_KILL_GRACE_S - used
            if cpu_left <= 0 or time.monotonic() >= wall:
                raise _Stopped(cpu=cpu_left <= 0, starved=limits.cpu_s is not None)
            reply = self._read(min(time.monotonic() + cpu_left, wall))
            if reply is not None and reply[0] != "started":  # sent also when nothing was loaded
                return reply

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _outcome(reply: tuple, limits: Limits) -> Any:
    """The value of a reply, or the exception it stands for."""
    kind = reply[0]
    if kind == "ok":
        return pickle.loads(reply[1])
    if kind == "raised":
        try:
            error = pickle.loads(reply[3]) if reply[3] is not None else None
        except Exception:
            error = None
        raise error if isinstance(error, BaseException) else RemoteError(reply[1], reply[2])
    if kind == "load":
        raise IsolationSetupError(
            f"a checker subprocess cannot load the {limits.label} ({reply[1]}); define it in a module "
            "that this process's import path reaches, or run it without isolation (limits=None)."
        )
    if kind == "cpu":
        raise IsolationFailure(limits.timed_out(cpu=True))
    if kind == "memory":
        raise IsolationFailure(f"{limits.label} ran out of memory (more than {limits.memory_bytes >> 20} MiB "
                               "beyond the checker's own)")
    raise IsolationFailure(f"{limits.label} called sys.exit({reply[1]})")


class _CheckerPool:
    """The checkers of this process: at most ``size``, shared by all threads.

    A thread takes an idle checker, else starts one while fewer than ``size`` exist, else waits
    its turn (first come, first served: without turns a thread that has just released a checker
    takes it back at once, and others starve). Checkers are started by one long-lived service
    thread, which also stops idle ones: a checker asks the kernel to kill it when the thread that
    started it ends (Linux ``PR_SET_PDEATHSIG``), so that thread must live as long as the process.
    """

    def __init__(self, size: int = CHECKER_POOL_SIZE, idle_s: float = CHECKER_IDLE_S,
                 wait_s: float = CHECKER_WAIT_LIMIT_S):
        self.size = size
        self.idle_s = idle_s
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._idle: list[tuple[float, _Checker]] = []  # (released at, checker), last used last
        self._live: set[_Checker] = set()
        self._reserved = 0  # checkers being started
        self._next_ticket = self._serving = 0  # turns of the threads waiting for a checker
        self._abandoned: set[int] = set()  # turns of threads that stopped waiting
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # futures of new checkers
        self._service: threading.Thread | None = None
        self._parents_checkers: list[_Checker] = []  # see forget()
        self._server: ForkServer | None = None  # started by the service thread, on first use
        self._server_failures = 0
        self._preloads: dict[tuple, None] = {}  # sent to the fork server, in order

    def run(self, request: _Request) -> Any:
        """The outcome of ``request`` on a checker. A checker past a limit, or that died, is
        killed (and replaced in the background); a starved one, or one that died, gets the call
        once more on a fresh checker."""
        limits, tries = request.limits, 2
        self._preload(request)
        while True:
            tries -= 1
            checker = self._acquire()
            try:
                reply = checker.call(request)
            except _Stopped as stopped:
                self._retire(checker, replace=True)
                if not stopped.starved or stopped.cpu:
                    raise IsolationFailure(limits.timed_out(cpu=stopped.cpu)) from None
                if tries == 0:
                    raise IsolationFailure(
                        f"{limits.label} timed out: no answer within {limits.wall_s:g} s of wall time "
                        f"while it used less than its {limits.cpu_s:g} s of CPU time, twice (the "
                        f"machine is overloaded; {limits.setting})") from None
            except _Died as died:
                self._retire(checker, replace=True)
                if tries == 0:
                    raise IsolationFailure(f"{limits.label} crashed: its process ended ({died})") from None
            except BaseException:
                self._retire(checker)  # e.g. KeyboardInterrupt mid-call: the pipe's state is unknown
                raise
            else:
                self._release(checker)
                return _outcome(reply, limits)

    def _serve_requests(self) -> None:
        """The service thread: starts the checkers asked for; stops idle ones now and then."""
        while True:
            try:
                future = self._requests.get(timeout=self.idle_s / 2)
            except queue.Empty:
                self.reap()
                continue
            try:
                future.set_result(self._new_checker())
            except BaseException as e:  # e.g. OSError: too many processes
                future.set_exception(e)

    def _new_checker(self) -> _Checker:
        """A checker forked from the fork server (started on first use, with the preloads sent
        so far), else, where none can run, a new interpreter. In the service thread only."""
        with self._cond:
            if (self._server is None and forkserver.AVAILABLE
                    and self._server_failures < FORK_SERVER_FAILURES):
                try:
                    self._server = ForkServer(list(TEMPLATE_MODULES), f"{__name__}:_serve", _checker_path(),
                                              _checker_env())
                except OSError:  # e.g. too many processes
                    self._server_failures += 1
                for preload in self._preloads if self._server is not None else ():
                    self._server.preload(*preload)
            server = self._server
        if server is not None:
            try:
                return _Checker(server)
            except ForkRefused:
                with self._cond:
                    self._server_failures += FORK_SERVER_FAILURES if server.refused else 1
                    if self._server is server:
                        self._server = None
                server.close()
        return _Checker()

    def _preload(self, request: _Request) -> None:
        """Has the fork server load the request's preloads not sent yet."""
        if all(preload in self._preloads for preload in request.preloads):
            return
        with self._cond:
            new = [preload for preload in request.preloads if preload not in self._preloads]
            self._preloads.update(dict.fromkeys(new))
            server = self._server
        for preload in new if server is not None else ():  # not under _cond: a fork may hold the socket
            server.preload(*preload)

    def _ask_for_checker(self) -> Future:
        """A future of a new checker, started by the service thread (the caller reserved it)."""
        future: Future = Future()
        with self._cond:
            if self._service is None:
                self._service = threading.Thread(target=self._serve_requests, name="verifier-checkers",
                                                 daemon=True)
                self._service.start()
        self._requests.put(future)
        return future

    def _spawn(self) -> _Checker:
        """Starts a checker (counted in ``_reserved`` by the caller until now)."""
        future = self._ask_for_checker()
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

    def _replace(self) -> None:
        """Starts a checker in the background, idle once started, while the pool has room: the
        next call after a killed checker finds one ready."""
        with self._cond:
            if len(self._live) + self._reserved >= self.size:
                return
            self._reserved += 1
        self._ask_for_checker().add_done_callback(self._started)

    def _started(self, future: Future) -> None:
        with self._cond:
            self._reserved -= 1
            if future.exception() is None:
                self._live.add(future.result())
                self._idle.insert(0, (time.monotonic(), future.result()))  # taken after warmer ones
            self._cond.notify_all()

    def _acquire(self) -> _Checker:
        """An idle checker, else a new one while fewer than ``size`` exist, else waits its turn;
        at most ``wait_s``, then gives its turn up and raises CheckerPoolTimeout."""
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
            f"verifier checker pool (size={self.size}): waited wait_s={self.wait_s:g} s for {what}. "
            "Calls hold a checker for a bounded time, so the pool is stuck or far too small for the "
            "threads verifying: raise rllib_dph.envs.isolation.set_checker_pool(size=..., wait_s=...)."
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

    def _retire(self, checker: _Checker, replace: bool = False) -> None:
        checker.kill()
        with self._cond:
            self._live.discard(checker)
            self._cond.notify_all()
        if replace:
            self._replace()

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

    def warm_up(self, prepare: Callable[[], Any] | None) -> None:
        """Makes sure one started checker, with ``prepare`` run, is idle in the pool."""
        checker = self._acquire()
        try:
            checker.wait_ready()
            if prepare is not None:
                request = _Request(_nothing, (), {}, Limits(prepare=prepare))
                _outcome(checker.call(request), request.limits)
        except BaseException:
            self._retire(checker)
            raise
        self._release(checker)

    def close(self) -> None:
        """Kills every checker (registered with ``atexit``)."""
        with self._cond:
            live, self._live, self._idle = list(self._live), set(), []
            server, self._server = self._server, None
        for checker in live:
            checker.kill()
        if server is not None:
            server.close()

    def forget(self) -> None:
        """In a forked child: let go of the parent's checkers and start with none. Our copies of
        their pipes are closed so that they still see end-of-input when the parent exits; the
        Popen objects are kept (not our processes to wait for or warn about)."""
        for checker in self._live:
            for stream in (checker.proc.stdin, checker.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            if isinstance(checker.proc, forkserver.ForkedProcess):
                checker.proc.close()
        if self._server is not None:
            self._server.forget()
        parents_checkers, preloads = list(self._live), self._preloads
        self.__init__(self.size, self.idle_s, self.wait_s)
        self._parents_checkers, self._preloads = parents_checkers, preloads


def _nothing() -> None:
    """The call of :meth:`_CheckerPool.warm_up`: its ``prepare`` is the point."""


_POOL = _CheckerPool()
atexit.register(_POOL.close)
os.register_at_fork(after_in_child=_POOL.forget)


def start_checker(prepare: Callable[[], Any] | None = None) -> None:
    """Starts a checker now (unless one is idle) and waits until it is ready, ``prepare`` run.

    Optional: the first call does it otherwise (not charged to its limits). Useful before timing
    calls, or to pay the start-up before training starts.

    Raises:
        RuntimeError: The checker could not start, or ``prepare`` failed in it.
    """
    try:
        _POOL.warm_up(prepare)
    except (_Died, IsolationSetupError, _Stopped) as e:
        raise RuntimeError(f"a verifier checker subprocess did not start: {e}") from e


def set_checker_pool(*, size: int | None = None, idle_s: float | None = None, wait_s: float | None = None) -> None:
    """Sets the bounds of this process's checker pool. Lowering ``size`` stops no checker: no new
    one starts until fewer than ``size`` exist, and idle ones are stopped after ``idle_s``.

    Args:
        size: Most checkers at once, in [1, MAX_CHECKER_POOL_SIZE] (default CHECKER_POOL_SIZE).
        idle_s: Seconds after which an idle checker is stopped, in CHECKER_IDLE_RANGE_S
            (default 60).
        wait_s: Longest wait of a call for a free checker, in CHECKER_WAIT_RANGE_S (default
            ``CHECKER_WAIT_LIMIT_S``, 1800); then the call raises :class:`CheckerPoolTimeout`.

    Raises:
        ArgumentError: ``size`` is not an int in [1, MAX_CHECKER_POOL_SIZE], or ``idle_s`` /
            ``wait_s`` not a number of seconds in their range (NaN and infinity included: they
            would end the pool's service thread or overflow its waits).
    """
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                             or not 1 <= size <= MAX_CHECKER_POOL_SIZE):
        raise ArgumentError(
            f"set_checker_pool: size={size!r} must be an int in [1, {MAX_CHECKER_POOL_SIZE}] "
            f"(checker subprocesses); e.g. size={CHECKER_POOL_SIZE} (the default)."
        )
    if idle_s is not None:
        idle_s = check_real(idle_s, "idle_s", low=CHECKER_IDLE_RANGE_S[0], high=CHECKER_IDLE_RANGE_S[1],
                            where="set_checker_pool", default=CHECKER_IDLE_S)
    if wait_s is not None:
        _POOL.wait_s = check_real(wait_s, "wait_s", low=CHECKER_WAIT_RANGE_S[0], high=CHECKER_WAIT_RANGE_S[1],
                                  where="set_checker_pool", default=CHECKER_WAIT_LIMIT_S)
    if size is not None:
        with _POOL._cond:
            _POOL.size = size
            _POOL._cond.notify_all()
    if idle_s is not None:
        _POOL.idle_s = idle_s
