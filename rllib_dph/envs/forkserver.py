"""A fork server: one template process that imports what its children need once, then forks each
child from itself, so that a child starts without an interpreter start or imports (the
isolation's checkers, :mod:`rllib_dph.envs.isolation`, start this way).

Contract:

- :class:`ForkServer` (the caller's side) starts the template with ``python -P -c`` (so no
  working folder is put first on its path), the caller's import path and environment; the
  template imports ``modules``, asks the kernel to kill it when the thread that started it ends
  (Linux ``PR_SET_PDEATHSIG``) and writes no core file.
- :meth:`ForkServer.fork` gives a child the caller's working folder, import path and environment
  of the moment, no controlling terminal (``setsid``), stdin/stdout pipes to the caller, a fresh
  seed of NumPy's global generator (Python's ``random`` reseeds itself) and the signal state of a
  new interpreter; the child runs ``entry(template_pid)`` and exits. It returns a
  :class:`ForkedProcess`, the part of :class:`subprocess.Popen` the isolation uses.
- :meth:`ForkServer.preload` imports a module, or runs a picklable function (a warm-up), in the
  template once it has had no fork to make for :data:`PRELOAD_AFTER_IDLE_S`, so that children
  forked later start with it; a failure there is ignored (the child
  meets it again where it matters). A template that has a second thread after its start or a
  preload (e.g. a math library's thread pool: give it ``OPENBLAS_NUM_THREADS=1``) refuses every
  later fork (forking a threaded process is unsafe): :meth:`ForkServer.fork` then raises
  :class:`ForkRefused`, and the caller starts processes its own way.
- Children die with the template (``PR_SET_PDEATHSIG``), which dies with the caller. The
  template reaps its children and reports each exit code on a pipe of its own per child
  (:meth:`ForkedProcess.wait`); killing goes through a pidfd, never a pid that may be reused.

Needs Linux >= 5.3 (pidfds): :data:`AVAILABLE` says whether this Python and kernel have them.
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

#: Length prefix of a pickled message (between the caller and the template, and the isolation's).
FRAME = struct.Struct("!Q")
_STATUS = struct.Struct("!i")  # an exit code, as subprocess.Popen.returncode has it
_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
#: The template runs a preload once no fork was asked of it for this long (a fork never waits
#: behind a preload that could wait).
PRELOAD_AFTER_IDLE_S = 0.5
#: Whether fork servers can run here (pidfds and file-descriptor passing).
AVAILABLE = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal") and hasattr(socket, "send_fds")


class ForkRefused(OSError):
    """The template cannot fork a child (it ended, it is threaded, or the kernel refused)."""


def die_with_parent(parent_pid: int) -> None:
    """Asks the kernel to kill this process when its parent ends (Linux); exits at once if the
    parent has already gone."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: end-of-input and RLIMIT_CPU still end it
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


# ----------------------------------------------------------------------------- the caller's side
class ForkedProcess:
    """A child of the template, seen from the caller: ``pid``, ``stdin`` and ``stdout`` (binary
    pipes), ``returncode`` (None until the template reported the exit), ``poll``, ``wait`` and
    ``kill`` as :class:`subprocess.Popen` has them."""

    def __init__(self, pid: int, pidfd: int, status_fd: int, stdin_fd: int, stdout_fd: int):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = os.fdopen(stdin_fd, "wb")
        self.stdout = os.fdopen(stdout_fd, "rb")
        self._pidfd, self._status = pidfd, status_fd
        # kill() on one thread and close() on another (a caller's deadline and the exit-time
        # cleanup) take turns, so a signal never goes to a closed or reused descriptor.
        self._fds_lock = threading.Lock()

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once the template reported it (``-SIGKILL`` if the template ended
        first: its children end with it); raises TimeoutExpired after ``timeout`` seconds."""
        if self.returncode is None:
            poller = select.poll()
            poller.register(self._status, select.POLLIN)
            if not poller.poll(None if timeout is None else max(timeout, 0.0) * 1000):
                raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout)
            data = os.read(self._status, _STATUS.size)
            if len(data) < _STATUS.size:  # the template ended first: wait for the child to follow
                poller = select.poll()
                poller.register(self._pidfd, select.POLLIN)
                if not poller.poll(None if timeout is None else max(timeout, 0.0) * 1000):
                    raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout)
            self.returncode = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else -signal.SIGKILL
            self.close()
        return self.returncode

    def kill(self) -> None:
        with self._fds_lock:
            if self.returncode is None and self._pidfd >= 0:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except ProcessLookupError:  # ended already
                    pass

    def close(self) -> None:
        """Closes the pidfd and the status pipe (``stdin``/``stdout`` are the caller's to close)."""
        with self._fds_lock:
            for fd in (self._pidfd, self._status):
                if fd < 0:
                    continue
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._pidfd = self._status = -1


class ForkServer:
    """The template process and the socket to it. Thread-safe; the thread that calls
    :meth:`start` must live as long as the children should (``PR_SET_PDEATHSIG``)."""

    def __init__(self, modules: list[str], entry: str, path: list[str], env: dict[str, str]):
        """``modules``: imported by the template at its start; ``entry``: ``"module:function"``
        that each child runs with the template's pid; ``path``, ``env``: the template's import
        path and environment."""
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        boot = ("import sys; sys.path[:] = sys.argv[2].split('\\n'); "
                "from rllib_dph.envs.forkserver import _serve; "
                "_serve(int(sys.argv[1]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])")
        flags = ["-P"] if sys.version_info >= (3, 11) else []
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, *flags, "-c", boot, str(os.getpid()), "\n".join(path),
                 str(theirs.fileno()), entry, *modules],
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=env, start_new_session=True,
            )
        self._socket = ours
        self.refused: str | None = None  # why the template refuses forks, once it does

    def fork(self, path: list[str], env: dict[str, str], timeout: float) -> ForkedProcess:
        """A child with this working folder, import path ``path`` and environment ``env``.

        Raises:
            ForkRefused: The template did not fork within ``timeout`` seconds, has ended, is
                threaded, or the kernel refused the fork.
        """
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            with self._lock:
                self._send(("fork", os.getcwd(), path, env), [stdin_r, stdout_w])
                reply, fds = self._receive(timeout)
        except (OSError, EOFError, pickle.UnpicklingError) as error:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            self.close()
            raise ForkRefused(f"the fork server did not answer ({type(error).__name__}: {error})") from None
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        if reply[0] != "forked":
            for fd in (stdin_w, stdout_r, *fds):
                os.close(fd)
            self.refused = reply[1]
            raise ForkRefused(f"the fork server refused: {reply[1]}")
        return ForkedProcess(reply[1], fds[0], fds[1], stdin_w, stdout_r)

    def preload(self, kind: str, what: Any) -> None:
        """Has the template import module ``what`` (``kind="module"``) or call the pickled
        function ``what`` (``kind="call"``) once it is idle (module docstring). Errors are
        ignored."""
        try:
            with self._lock:
                self._send(("preload", kind, what), [])
        except OSError:  # ended: the next fork says so
            pass

    def _send(self, message: tuple, fds: list[int]) -> None:
        data = pickle.dumps(message)
        socket.send_fds(self._socket, [FRAME.pack(len(data))], fds)
        self._socket.sendall(data)

    def _receive(self, timeout: float) -> tuple[tuple, list[int]]:
        self._socket.settimeout(timeout)
        try:
            return _receive(self._socket)
        finally:
            self._socket.settimeout(None)

    def close(self) -> None:
        """Ends the template (its children end with it)."""
        self._socket.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def forget(self) -> None:
        """In a forked copy of the caller: lets go of the template (the parent's) without
        ending it."""
        self._socket.close()


def _receive(sock: socket.socket) -> tuple[tuple, list[int]]:
    """One message and the file descriptors sent with it; EOFError when the peer closed."""
    header, fds, _, _ = socket.recv_fds(sock, FRAME.size, 4)
    while len(header) < FRAME.size:
        chunk = sock.recv(FRAME.size - len(header))
        if not chunk:
            raise EOFError("the socket closed")
        header += chunk
    size, data = FRAME.unpack(header)[0], bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the socket closed")
        data += chunk
    return pickle.loads(data), list(fds)


# ----------------------------------------------------------------------------- the template's side
class _Template:
    """The template's state: its children's status pipes and why it refuses forks (if it does)."""

    def __init__(self, sock: socket.socket, entry: Any):
        self.sock, self.entry = sock, entry
        self.children: dict[int, int] = {}  # pid -> write end of its status pipe
        self.refused: str | None = None

    def reap(self, signum=None, frame=None) -> None:
        """The SIGCHLD handler: reports the exit code of every ended child on its status pipe."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.children.pop(pid, None)
            if fd is not None:
                try:
                    os.write(fd, _STATUS.pack(os.waitstatus_to_exitcode(status)))
                except OSError:  # the caller closed its end
                    pass
                os.close(fd)

    def fork(self, cwd: str, path: list[str], env: dict[str, str], stdin_fd: int, stdout_fd: int) -> None:
        """Forks a child on these pipes and sends the caller its pid, pidfd and status pipe."""
        if self.refused is not None:
            os.close(stdin_fd)
            os.close(stdout_fd)
            return self._reply(("refused", self.refused), [])
        status_r, status_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        template = os.getpid()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # till it is recorded
        try:
            pid = os.fork()
        except OSError as error:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            for fd in (status_r, status_w, stdin_fd, stdout_fd):
                os.close(fd)
            return self._reply(("refused", f"fork failed: {error}"), [])
        if pid == 0:
            self._become_child(template, blocked, cwd, path, env, stdin_fd, stdout_fd, status_r, status_w)
        for fd in (stdin_fd, stdout_fd):  # the child's ends: the caller sees end-of-input when it ends
            os.close(fd)
        self.children[pid] = status_w
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._reply(("forked", pid), [pidfd, status_r])
        for fd in (pidfd, status_r):
            os.close(fd)

    def _become_child(self, template: int, mask: set, cwd: str, path: list[str], env: dict[str, str],
                      stdin_fd: int, stdout_fd: int, *own: int) -> None:
        """In the forked child: the caller's context, then ``entry(template)``; never returns."""
        code = 1
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            die_with_parent(template)
            os.setsid()
            os.dup2(stdin_fd, 0)
            os.dup2(stdout_fd, 1)
            for fd in (self.sock.fileno(), stdin_fd, stdout_fd, *own, *self.children.values()):
                os.close(fd)
            os.chdir(cwd)
            sys.path[:] = path
            os.environ.clear()
            os.environ.update(env)
            if "numpy.random" in sys.modules:
                sys.modules["numpy.random"].seed()
            self.entry(template)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(code)

    def preload(self, kind: str, what: Any) -> None:
        """Imports the module or runs the pickled function; refuses later forks if that left a
        second thread."""
        try:
            if kind == "module":
                importlib.import_module(what)
            else:
                pickle.loads(what)()
        except BaseException:  # SystemExit included: the child meets it again and reports it
            pass
        self.check_threads(f"a preload ({kind} {what if kind == 'module' else 'call'})")

    def check_threads(self, what: str) -> None:
        """Refuses every later fork if this process has more than one thread now."""
        tasks = "/proc/self/task"
        threads = len(os.listdir(tasks)) if os.path.isdir(tasks) else threading.active_count()
        if threads > 1 and self.refused is None:
            self.refused = f"{what} started a thread"

    def _reply(self, message: tuple, fds: list[int]) -> None:
        data = pickle.dumps(message)
        socket.send_fds(self.sock, [FRAME.pack(len(data))], fds)
        self.sock.sendall(data)


def _serve(parent_pid: int, sock_fd: int, entry: str, modules: list[str]) -> None:
    """The template: imports ``modules``, then forks and preloads as the caller asks until the
    caller closes the socket."""
    import resource

    die_with_parent(parent_pid)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file when a limit ends a child
    os.dup2(2, 1)  # stray prints go to stderr
    for module in modules:
        importlib.import_module(module)
    module, _, function = entry.partition(":")
    template = _Template(socket.socket(fileno=sock_fd), getattr(importlib.import_module(module), function))
    template.check_threads(f"importing {', '.join(modules)}")
    signal.signal(signal.SIGCHLD, template.reap)
    poller, pending = select.poll(), []  # preloads not run yet
    poller.register(template.sock, select.POLLIN)
    while True:
        if pending and not poller.poll(PRELOAD_AFTER_IDLE_S * 1000):
            template.preload(*pending.pop(0))
            continue
        try:
            message, fds = _receive(template.sock)
        except (EOFError, OSError):
            return  # the caller closed the socket: end (the children end with this process)
        if message[0] == "fork":
            template.fork(*message[1:], *fds)
        else:
            pending.append(message[1:])
