"""A Ray cluster of two nodes, started with ``ray start`` on this machine (``tests/ray_cluster.py``):
the learner runs on the head node and the env runner on the worker node, placed by the config's
own resource fields; weights reach the env runner on the other node every iteration; ``rllib
train`` attaches to the cluster and writes checkpoints to a storage path both nodes share; a
worker node that dies mid-run either stops the run with an error naming the node, after which
``--resume`` continues from the last checkpoint on a new worker node, or, when a new worker node
joins in time, the run continues on it.

Run with ``python -m pytest -m multinode`` (minutes: every run starts Ray workers on two nodes).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ray_cluster import HEAD_IP, TRAIN_CONFIG, WORKER_IP, WORKER_RESOURCE, TwoNodeCluster

pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    """The two-node cluster of this module, stopped (its processes only) whatever happens."""
    nodes = TwoNodeCluster()
    try:
        nodes.start_head()
        nodes.start_worker()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def two_nodes(cluster):
    """The cluster with a live worker node (a test before may have killed it)."""
    if not cluster.worker_alive():
        cluster.start_worker()
    return cluster


def _train_args(storage: Path, name: str, stop: int, **config) -> list[str]:
    return [
        sys.executable, "-m", "rllib_dph.cli", "train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0",
        "--config", json.dumps({**TRAIN_CONFIG, **config}), "--stop", json.dumps({"training_iteration": stop}),
        "--checkpoint-freq", "1", "--storage-path", str(storage), "--name", name,
    ]


def _results(experiment: Path) -> list[dict]:
    trials = list(experiment.glob("GRPO_*"))
    if not trials or not (trials[0] / "result.json").is_file():
        return []
    return [json.loads(line) for line in (trials[0] / "result.json").read_text().splitlines() if line.strip()]


def _actors(cluster: TwoNodeCluster) -> list[dict]:
    """Every actor of the cluster (alive or dead) with its class, state and node address, read
    from the GCS by a driver of its own."""
    script = (
        "import json, ray; ray.init(log_to_driver=False); "
        "nodes = {n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes()}; "
        "print(json.dumps([{'class': a['ActorClassName'], 'state': a['State'], 'ip': nodes.get(a['Address']['NodeID']), "
        "'restarts': a.get('NumRestarts', 0)} for a in ray._private.state.actors().values()]))"
    )
    done = subprocess.run([sys.executable, "-c", script], env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_weights_reach_the_env_runner_on_the_other_node_every_iteration(two_nodes):
    """A script attached with RAY_ADDRESS: after each iteration the env runner on the worker node
    holds the weights the learner on the head node holds (same version, same SHA-256), loaded
    from the published object, which the worker node's object store now holds too."""
    done = subprocess.run(
        [sys.executable, str(TESTS / "multinode_driver.py"), "3"], cwd=REPO, env=two_nodes.env(),
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [row["iteration"] for row in rows] == [1, 2, 3]
    digests = []
    for row in rows:
        learner, runner = row["learner"], row["env_runner"]
        assert (learner["ip"], runner["ip"]) == (HEAD_IP, WORKER_IP)
        assert learner["version"] == runner["version"] == row["published_version"] == row["iteration"]
        assert runner["digest"] == learner["digest"]
        assert runner["weights_id"] == row["published_id"]
        assert WORKER_IP in row["object_store_nodes"]
        digests.append(runner["digest"])
    assert len(set(digests)) == 3  # every update changed the weights the runner holds


def test_rllib_train_attaches_places_by_config_and_checkpoints_to_shared_storage(two_nodes):
    """`RAY_ADDRESS=<head> rllib train --config '{... custom_resources_per_learner,
    custom_resources_per_env_runner ...}' --storage-path <shared>`: the learner runs on the head
    node, the env runner on the worker node, every iteration's rows come from the weights of
    that iteration (staleness 0), and each iteration leaves a checkpoint in the storage path."""
    storage = two_nodes.shared_storage
    done = subprocess.run(_train_args(storage, "placed", stop=3), cwd=REPO, env=two_nodes.env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    results = _results(storage / "placed")
    assert [r["training_iteration"] for r in results] == [1, 2, 3]
    assert [r["weights_version"] for r in results] == [1, 2, 3]
    assert all(r["staleness_max"] == 0 for r in results)
    (trial,) = (storage / "placed").glob("GRPO_*")
    assert len(list(trial.glob("checkpoint_*/rllib_checkpoint.json"))) == 2  # the latest 2 are kept
    placed = {(a["class"], a["ip"]) for a in _actors(two_nodes)}
    assert ("LLMEnvRunner", WORKER_IP) in placed and ("LLMEnvRunner", HEAD_IP) not in placed
    learners = {ip for cls, ip in placed if "WrappedExecutable" in cls}  # RLlib's learner actor class
    assert learners == {HEAD_IP}
