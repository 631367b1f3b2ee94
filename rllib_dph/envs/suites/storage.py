"""Where the bundled suites keep their generated files (written with ``rllib_dph.files``)."""

from __future__ import annotations

import os
import pathlib

from rllib_dph.files import home

#: Environment variable that overrides the suite directory.
DATA_ENV_VAR = "RLLIB_DPH_DATA"
#: Version of the generated files; bump it whenever their content changes.
SUITE_VERSION = "v1"


def suite_root() -> pathlib.Path:
    """Directory holding the generated suite files.

    Returns:
        ``$RLLIB_DPH_DATA`` when that variable is set and non-empty, else
        ``suites/v1`` under the cache root (``rllib_dph.files.home()``: ``$RLLIB_DPH_HOME``, by
        default ``~/.cache/rllib_dph``). The directory is not created here.
    """
    override = os.environ.get(DATA_ENV_VAR)
    if override:
        return pathlib.Path(override).expanduser().resolve()
    return home() / "suites" / SUITE_VERSION


def sql_db_root() -> pathlib.Path:
    """Directory of the generated SQLite databases: ``sql_db_root() / db_id`` is a database file."""
    return suite_root() / "sql"
