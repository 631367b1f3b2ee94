"""Where the bundled suites keep their generated files, and how they are written safely."""

from __future__ import annotations

import os
import pathlib
import tempfile

#: Environment variable that overrides the suite directory.
DATA_ENV_VAR = "RLLIB_DPH_DATA"
#: Version of the generated files; bump it whenever their content changes.
SUITE_VERSION = "v1"


def suite_root() -> pathlib.Path:
    """Directory holding the generated suite files.

    Returns:
        ``$RLLIB_DPH_DATA`` when that variable is set and non-empty, else
        ``~/.cache/rllib_dph/suites/v1``. The directory is not created here.
    """
    override = os.environ.get(DATA_ENV_VAR)
    if override:
        return pathlib.Path(override).expanduser().resolve()
    return pathlib.Path.home() / ".cache" / "rllib_dph" / "suites" / SUITE_VERSION


def sql_db_root() -> pathlib.Path:
    """Directory of the generated SQLite databases: ``sql_db_root() / db_id`` is a database file."""
    return suite_root() / "sql"


def write_bytes_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` unless the file already holds exactly these bytes.

    The bytes go to a temporary file in the same directory that then replaces ``path`` in one
    ``os.replace``, so concurrent writers (several Ray actors building the suite at once) and
    readers never see a partial file.

    Args:
        path: Destination file; missing parent directories are created.
        data: The complete file content.
    """
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        pathlib.Path(tmp_name).unlink(missing_ok=True)
        raise
