"""Imports of the ``rllib`` command: the user's own modules.

``rllib train --import mymodule`` imports the user's modules so that the envs they register
(``rllib_dph.envs.register_verifier_env``) exist; the module names travel to Ray workers in
``$RLLIB_DPH_IMPORTS`` and are imported there too (Ray's ``worker_process_setup_hook``, see
:func:`ray_runtime_env`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

#: Environment variable with the user's modules (comma-separated) that Ray workers import.
IMPORTS_ENV_VAR = "RLLIB_DPH_IMPORTS"
#: Environment variable with the folder the user's modules are imported from (the launch folder).
LAUNCH_DIR_ENV_VAR = "RLLIB_DPH_LAUNCH_DIR"
#: The Ray worker start-up hook (a ``module.function`` path, see ``ray_runtime_env``).
WORKER_SETUP_HOOK = "rllib_dph.cli.imports.setup_worker"


def import_user_modules(names: Sequence[str], launch_dir: str | None = None) -> list[str]:
    """Imports the user's modules by dotted name (``mymodule``, ``myproject.envs_reverse``).

    The launch folder is appended to ``sys.path`` (after the installed packages, so it cannot
    shadow them) for modules that live there; a ``.py`` file in that folder is accepted as well.

    Returns:
        The dotted names imported (for :func:`ray_runtime_env`).

    Raises:
        SystemExit: A module cannot be imported (its error is named).
    """
    launch_dir = os.path.abspath(launch_dir or os.getcwd())
    if launch_dir not in sys.path:
        sys.path.append(launch_dir)
    imported = []
    for name in names:
        if name.endswith(".py"):
            name = os.path.relpath(os.path.abspath(name), launch_dir)[:-3].replace(os.sep, ".")
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the user's module: report its error, once
            raise SystemExit(f"rllib: --import {name}: {type(e).__name__}: {e}") from None
        imported.append(name)
    return imported


def add_import_flag(parser: argparse.ArgumentParser) -> None:
    """Adds ``--import MODULE`` (repeatable; read by :func:`import_user_modules`) to ``parser``."""
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="import this module first (it may register envs); repeatable",
    )


def setup_worker() -> None:
    """Ray worker start-up: imports the modules in ``$RLLIB_DPH_IMPORTS``."""
    names = [n for n in os.environ.get(IMPORTS_ENV_VAR, "").split(",") if n]
    if names:
        import_user_modules(names, os.environ.get(LAUNCH_DIR_ENV_VAR))


def ray_runtime_env(user_modules: Sequence[str], launch_dir: str | None = None) -> dict:
    """The ``runtime_env`` of ``ray.init`` that runs :func:`setup_worker` in every worker.

    Args:
        user_modules: Dotted names of the user's modules (already imported in the driver).
        launch_dir: The folder they were imported from (default: the cwd).
    """
    env_vars = {IMPORTS_ENV_VAR: ",".join(user_modules), LAUNCH_DIR_ENV_VAR: os.path.abspath(launch_dir or os.getcwd())}
    return {"worker_process_setup_hook": WORKER_SETUP_HOOK, "env_vars": env_vars}
