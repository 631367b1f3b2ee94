"""`rllib train --wandb-project --wandb-offline --mlflow-tracking-uri`: both trackers log offline.

Needs the tracking extra (`pip install "rllib_dph[tracking]"`); skipped without it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

REPO = Path(__file__).resolve().parents[1]


def test_wandb_offline_and_mlflow_file_store(tmp_path):
    cmd = [
        sys.executable, "-m", "rllib_dph.cli", "train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0",
        "--config", json.dumps({"model_name": "tiny-random", "max_response_length": 8, "group_size": 2,
                                "prompts_per_step": 2, "env_config": {"data": "sql_synth/test"}}),
        "--stop", json.dumps({"training_iteration": 2}), "--storage-path", "runs", "--name", "tracked",
        "--wandb-project", "rllib-dph-test", "--wandb-offline", "--mlflow-tracking-uri", "mlruns",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**env, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-4000:]
    [rewards] = list((tmp_path / "mlruns").glob("*/*/metrics/env_runners/reward_mean"))
    steps = [int(line.split()[2]) for line in rewards.read_text().splitlines()]
    assert steps == [1, 2]  # one MLflow value per training iteration
    assert list((tmp_path / "runs" / "tracked").glob("*/wandb/offline-run-*"))
