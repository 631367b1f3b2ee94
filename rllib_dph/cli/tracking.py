"""Experiment tracking for ``rllib train``: W&B and MLflow through Tune's logger callbacks.

TensorBoard needs nothing: Tune writes ``events.out.tfevents*`` files into every trial folder
(``tensorboard --logdir ~/ray_results``). Both trackers here work offline:

- W&B: ``--wandb-project NAME`` (``--wandb-offline`` or ``WANDB_MODE=offline`` writes the runs
  locally; ``wandb sync`` uploads them later);
- MLflow: ``--mlflow-tracking-uri URI``; a plain folder (``mlruns``) is a local file store,
  resolved against the launch folder (``mlflow ui --backend-store-uri mlruns`` shows it);
  ``sqlite:///mlflow.db`` works too with the full ``mlflow`` package.

Both need their package: ``pip install "rllib_dph[tracking]"`` (wandb, mlflow-skinny).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional

#: The pip command that installs the trackers.
INSTALL_HINT = 'pip install "rllib_dph[tracking]"'


def tracking_problems(*, wandb_project: Optional[str], mlflow_tracking_uri: Optional[str]) -> list[str]:
    """Messages for requested trackers whose package is not installed (checked before Ray starts)."""
    wanted = {"wandb": wandb_project, "mlflow": mlflow_tracking_uri}
    return [
        f"--{'wandb-project' if pkg == 'wandb' else 'mlflow-tracking-uri'} needs the `{pkg}` package; "
        f"install it with `{INSTALL_HINT}`."
        for pkg, value in wanted.items()
        if value and importlib.util.find_spec(pkg) is None
    ]


def mlflow_uri(uri: str, launch_dir: Optional[str] = None) -> str:
    """``uri`` unchanged when it has a scheme (``http://``, ``file:``, ``databricks``), else a
    ``file://`` URI of that folder resolved against ``launch_dir`` (default: the cwd)."""
    if "://" in uri or uri.startswith("file:") or uri == "databricks":
        return uri
    return Path(launch_dir or os.getcwd(), os.path.expanduser(uri)).resolve().as_uri()


def logger_callbacks(
    experiment: str,
    *,
    wandb_project: Optional[str] = None,
    wandb_offline: bool = False,
    mlflow_tracking_uri: Optional[str] = None,
    launch_dir: Optional[str] = None,
) -> list:
    """Tune logger callbacks for the requested trackers.

    Args:
        experiment: Experiment name (W&B group, MLflow experiment name).
        wandb_project: W&B project; None disables W&B.
        wandb_offline: Set ``WANDB_MODE=offline`` (no account or network needed).
        mlflow_tracking_uri: MLflow tracking URI or local folder; None disables MLflow.
        launch_dir: Folder a relative MLflow folder is resolved against.
    """
    callbacks = []
    if wandb_project:
        from ray.air.integrations.wandb import WandbLoggerCallback

        if wandb_offline:
            os.environ["WANDB_MODE"] = "offline"  # read by the callback and by its logging actor
        callbacks.append(WandbLoggerCallback(project=wandb_project, group=experiment))
    if mlflow_tracking_uri:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        uri = mlflow_uri(mlflow_tracking_uri, launch_dir)
        if uri.startswith("file:"):  # MLflow >= 3.7 refuses its file store unless allowed
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        callbacks.append(MLflowLoggerCallback(tracking_uri=uri, experiment_name=experiment))
    return callbacks
