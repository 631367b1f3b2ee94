"""Persistent state on disk: the cache root, atomic writes and file locks (the one owner of each).

Everything rllib_dph keeps between runs — model builds, the suites' generated files, pre-sampled
data, kept fingerprints, evaluation results, Algorithm checkpoints — is written through this
module, so that a process killed at any instant (``kill -9``, OOM, a full disk) leaves either the
previous content or the new one, never a half-written file that a later run would trust:

- :func:`atomic_path` / :func:`write_bytes_atomic` / :func:`write_text_atomic` /
  :func:`write_json_atomic`: a file is written to a temporary sibling, flushed to disk
  (``fsync``) and renamed over the destination in one ``os.replace``;
- :func:`atomic_dir`: a folder is written into a temporary sibling folder that replaces the
  destination only when complete (the old folder is moved aside first and deleted after; the
  window between the two renames is the only time the destination is missing, and a killed
  process then leaves the old folder in ``.<name>.old-*`` beside it, never a partial one);
- :func:`file_lock`: an exclusive ``flock`` with a timeout whose error names the lock file, the
  process holding it (its pid and host, recorded in the lock file) and the timeout.
- :func:`write_checksum` / :func:`read_verified`: a data file's sha256 kept in ``<file>.sha256``
  beside it and checked on every read, so a file corrupted or truncated after it was written is
  refused, never used.
- :func:`write_manifest` / :func:`manifest_problem`: the same for a folder (a checkpoint): the
  sha256 of each of its files, written last, so a partial copy or a changed file is told apart
  from a complete folder.

Temporary files and folders start with ``.<name>.`` next to their destination, so the rename
never crosses a file system; :func:`remove_leftovers` deletes those of a killed writer.

This module imports nothing of the package (``rllib_dph.envs`` uses it too) and only the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

#: Environment variable naming the cache root of rllib_dph.
HOME_ENV_VAR = "RLLIB_DPH_HOME"
#: Default lock wait in seconds (6 h): long enough for another process to build a model (the SFT
#: warm start takes the longest) or pre-sample a data set on a busy CPU machine; a lock held longer
#: is reported, not waited on forever.
LOCK_TIMEOUT_S = 6 * 3600.0
#: How often a waiting :func:`file_lock` tries again, in seconds.
LOCK_POLL_S = 0.1
#: How often a waiting :func:`file_lock` says what it waits for, in seconds (and once at once).
LOCK_REPORT_S = 300.0
#: Infix of temporary files and folders (``.<name>.<infix>-<random>``).
TEMP_INFIX = "writing"
#: Infix of a replaced folder waiting to be deleted by :func:`atomic_dir`.
OLD_INFIX = "old"
#: Suffix of the checksum file written beside a data file (:func:`write_checksum`).
CHECKSUM_SUFFIX = ".sha256"
#: The list of a folder's files and their sha256, written last into it (:func:`write_manifest`).
MANIFEST_FILE = "manifest.sha256"


def home() -> Path:
    """The cache root: ``$RLLIB_DPH_HOME`` when set and non-empty, else ``~/.cache/rllib_dph``.

    Models (``models/``), the suites' generated files (``suites/``), kept fingerprints
    (``fingerprints/``) and, in the tuned examples, pre-sampled data (``presample/``) live under it.
    """
    return Path(os.environ.get(HOME_ENV_VAR) or Path.home() / ".cache" / "rllib_dph").expanduser()


class LockTimeout(TimeoutError):
    """A :func:`file_lock` not acquired in time; the message names the lock, its holder and the timeout.

    Attributes:
        path: The lock file.
        holder: Who holds it, as its file records it (``pid <pid> on <host> since <time>``).
    """

    def __init__(self, message: str, *, path: Path, holder: str):
        super().__init__(message)
        self.path, self.holder = path, holder


def _fsync_dir(directory: Path) -> None:
    """Makes a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temp_name(path: Path, infix: str = TEMP_INFIX) -> str:
    return f".{path.name}.{infix}-"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, mode: int = 0o644) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; when the block ends without error, the file
    written there is fsynced and renamed to ``path`` in one ``os.replace``.

    For writers that take a path (``pyarrow.parquet.write_table``, ``torch.save``). On an error
    the temporary file is removed and ``path`` keeps its previous content (or stays absent).
    Missing parent folders are created.

    Args:
        path: Destination file.
        mode: Permissions of the new file (a cache entry other users may read).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=_temp_name(path))
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Writes ``data`` to ``path`` atomically (:func:`atomic_path`) unless the file already holds
    exactly these bytes (concurrent writers of the same content then do not rewrite it)."""
    path = Path(path)
    try:
        if path.read_bytes() == data:
            return path
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        pass
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` atomically; see :func:`write_bytes_atomic`."""
    return write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | os.PathLike, data: Any, *, indent: Optional[int] = 2, **kwargs) -> Path:
    """Writes ``json.dumps(data, indent=indent, **kwargs)`` to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(data, indent=indent, **kwargs))


def checksum_path(path: str | os.PathLike) -> Path:
    """The checksum file of ``path``: ``<path>.sha256`` beside it."""
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def sha256_of(path: str | os.PathLike) -> str:
    """The sha256 of the file ``path`` (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksum(path: str | os.PathLike, digest: str) -> Path:
    """Writes ``digest`` (the sha256 of ``path``'s content) to :func:`checksum_path` atomically, in
    ``sha256sum``'s format (``sha256sum -c`` checks it in the file's folder)."""
    return write_text_atomic(checksum_path(path), f"{digest}  {Path(path).name}\n")


class ChecksumError(ValueError):
    """A file whose bytes are not those its checksum file recorded, or that has no checksum file.

    Attributes:
        path: The file.
    """

    def __init__(self, message: str, *, path: Path):
        super().__init__(message)
        self.path = path


def read_verified(path: str | os.PathLike) -> bytes:
    """The bytes of ``path`` after checking them against its checksum file (:func:`write_checksum`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ChecksumError: its checksum file is missing or unreadable, or the bytes differ from what it
            recorded (a corrupted or truncated file); the message names both files and sizes.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        recorded = checksum_path(path).read_text().split()[0]
    except (OSError, IndexError, UnicodeDecodeError) as e:
        raise ChecksumError(f"{path} has no readable checksum file {checksum_path(path)} ({e!r}), so whether its "
                            "bytes are the ones written is unknown", path=path) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != recorded:
        raise ChecksumError(f"{path} is corrupted or truncated: its {len(data)} bytes have sha256 {actual}, but "
                            f"{checksum_path(path)} recorded {recorded} when it was written", path=path)
    return data


def write_manifest(folder: str | os.PathLike) -> Path:
    """Writes the sha256 of every file under ``folder`` (paths relative to it, sorted) to
    ``folder/MANIFEST_FILE``, in ``sha256sum``'s format. Write it last: a copy of the folder
    that stopped midway (a full disk) lacks it or files it lists, which :func:`manifest_problem` tells."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    lines = [f"{sha256_of(p)}  {p.relative_to(folder).as_posix()}\n" for p in files]
    return write_text_atomic(folder / MANIFEST_FILE, "".join(lines))


def manifest_problem(folder: str | os.PathLike) -> Optional[str]:
    """What is wrong with ``folder`` against its :func:`write_manifest` (None: every file it lists
    is there with the bytes written): no manifest, or a file missing, truncated or changed."""
    folder = Path(folder)
    try:
        lines = (folder / MANIFEST_FILE).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return f"it has no readable {MANIFEST_FILE} ({type(e).__name__}), the list of its files written last"
    for line in lines:
        digest, _, name = line.partition("  ")
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if sha256_of(path) != digest:
            return f"{path} is truncated or changed ({path.stat().st_size} bytes, not the sha256 recorded)"
    return None


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, mode: int = 0o755) -> Iterator[Path]:
    """Yields an empty temporary folder beside ``path``; when the block ends without error it
    replaces ``path`` (an existing ``path`` is moved aside, the new folder renamed in, the old
    one deleted).

    On an error the temporary folder is deleted and ``path`` is untouched. A process killed inside
    the block leaves ``path`` as it was plus a ``.<name>.writing-*`` folder, which the next
    :func:`atomic_dir` of the same ``path`` (or :func:`remove_leftovers`) deletes. Concurrent
    writers of one ``path`` must hold a :func:`file_lock`.

    Args:
        path: Destination folder (its parent is created).
        mode: Permissions of the new folder (``mkdtemp`` makes it private; a cache entry is shared).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_name(path), dir=path.parent))
    os.chmod(tmp, mode)
    try:
        yield tmp
        _replace_dir(tmp, path)
    finally:
        _rmtree(tmp)


def _replace_dir(new: Path, path: Path) -> None:
    """Renames folder ``new`` to ``path``, moving an existing ``path`` aside and deleting it after."""
    if path.is_dir() and not path.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=_temp_name(path, OLD_INFIX), dir=path.parent))
        os.rename(path, old / path.name)
        os.rename(new, path)
        _fsync_dir(path.parent)
        _rmtree(old)
    else:
        os.rename(new, path)  # fails on an existing file: never replaces a file by a folder
        _fsync_dir(path.parent)


def remove_leftovers(path: str | os.PathLike) -> list[Path]:
    """Deletes the temporary files and folders a killed writer of ``path`` left beside it;
    returns them. Call it only where no other process is writing ``path`` (under its lock)."""
    path = Path(path)
    found = [p for infix in (TEMP_INFIX, OLD_INFIX) for p in path.parent.glob(_temp_name(path, infix) + "*")]
    for p in found:
        _rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    return found


def _holder(lock_path: Path) -> str:
    """Who holds a lock, as recorded in its file by :func:`file_lock` ("unknown" if nothing is)."""
    try:
        text = lock_path.read_text().strip()
    except OSError:
        text = ""
    return text or "unknown (no holder recorded)"


def _waiting(path: Path, what: str, waited_s: float, timeout_s: float) -> str:
    """The line a waiting :func:`file_lock` reports: the lock, what it protects, its holder, the wait."""
    return (f"rllib_dph: waiting for the lock {path}{f' ({what})' if what else ''}, held by {_holder(path)}; "
            f"waited {waited_s:.0f} s of {timeout_s:g} s")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, timeout_s: float = LOCK_TIMEOUT_S, what: str = "",
              report: Optional[Callable[[str], None]] = _to_stderr, report_every_s: float = LOCK_REPORT_S) -> Iterator[Path]:
    """Holds an exclusive ``flock`` on the file ``path`` (created with its parents) for the block.

    The holder writes its pid, host and start time into the file, so a waiter can say who holds
    it: at once and every ``report_every_s`` while it waits, and in the error when it times out.
    The lock is released when the block ends or the process dies (the kernel drops ``flock``
    locks of dead processes), so a killed holder never blocks the next run.

    Args:
        path: The lock file.
        timeout_s: How long to wait for another holder, in seconds (>= 0; ``math.inf`` waits forever).
        what: What the lock protects, for the messages (e.g. "the model build of tiny-random").
        report: Called with a line saying what this process waits for (the lock, what it
            protects, its holder, the time waited), at once and every ``report_every_s``;
            ``rllib_dph: waiting ...`` on stderr by default, None says nothing.
        report_every_s: Seconds between those lines (default :data:`LOCK_REPORT_S`).

    Raises:
        LockTimeout: not acquired within ``timeout_s``; names the lock file, its holder and the timeout.
        ValueError: a negative or NaN ``timeout_s``.
    """
    if not timeout_s >= 0:
        raise ValueError(f"file_lock timeout_s={timeout_s!r} must be >= 0 (seconds; math.inf waits forever).")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline, next_report = started + timeout_s, started
    with open(path, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            now = time.monotonic()
            if report is not None and timeout_s > 0 and now >= next_report:
                report(_waiting(path, what, now - started, timeout_s))
                next_report = now + report_every_s
            if now >= deadline:
                holder = _holder(path)
                raise LockTimeout(
                    f"waited {timeout_s:g} s for the lock {path}{f' ({what})' if what else ''}, held by "
                    f"{holder}; wait for that process to finish, stop it if it is stuck (a dead "
                    "process releases the lock by itself), or raise the timeout.",
                    path=path, holder=holder,
                )
            time.sleep(LOCK_POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        handle.flush()
        try:
            yield path
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)
