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

from ray_cluster import HEAD_IP, TRAIN_CONFIG, WORKER_IP, TwoNodeCluster

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


#: Prints the cluster's actors as JSON (``_actors``).
_ACTORS_SCRIPT = """
import json, ray
ray.init(log_to_driver=False)
nodes = {node["NodeID"]: node for node in ray.nodes()}
actors = []
for actor in ray._private.state.actors().values():
    node = nodes.get(actor["Address"]["NodeID"], {})
    actors.append({"id": actor["ActorID"], "class": actor["ActorClassName"], "state": actor["State"], "restarts": actor["NumRestarts"],
                   "ip": node.get("NodeManagerAddress"), "node_alive": node.get("Alive")})
print(json.dumps(actors))
"""


def _actors(cluster: TwoNodeCluster) -> list[dict]:
    """Every actor the cluster ran (alive or dead): its id, class, state, restarts, and the address
    of the node it ran on last and whether that node is alive, read from the GCS by a driver of
    its own (Ray's state API needs the dashboard, which minimal Ray lacks)."""
    done = subprocess.run([sys.executable, "-c", _ACTORS_SCRIPT], env=cluster.env(), capture_output=True, text=True, timeout=120)
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
    assert {ip for cls, ip in placed if cls == "GRPO"} == {HEAD_IP}  # the algorithm: Tune's trial actor


def _start_training(cluster: TwoNodeCluster, args: list[str], log: Path) -> subprocess.Popen:
    """`rllib train` in a process group of its own, its output in ``log``."""
    return subprocess.Popen(args, cwd=REPO, env=cluster.env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill_worker_node_after(cluster: TwoNodeCluster, experiment: Path, iterations: int, proc: subprocess.Popen,
                            log: Path) -> int:
    """SIGKILLs the worker node's raylet once the run wrote ``iterations`` results and as many
    checkpoints; returns the iterations written by then."""
    deadline = time.time() + 400
    while True:
        done = _results(experiment)
        saved = len(list(experiment.glob("GRPO_*/checkpoint_*/rllib_checkpoint.json")))
        if len(done) >= iterations and saved:
            break
        assert proc.poll() is None, "the run ended before the node was killed:\n" + log.read_text()[-5000:]
        assert time.time() < deadline, "the run did not reach the iteration to kill the node at"
        time.sleep(0.2)
    cluster.raylet(WORKER_IP).kill()
    return len(done)


def _stop(proc: subprocess.Popen) -> None:
    """Kills the run's process group if it is still running (a failed assertion left it)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_lost_worker_node_stops_the_run_naming_it_and_resume_continues_on_a_new_node(two_nodes):
    """The worker node dies mid-run and no node offering `env_runner_node` is left: after
    `env_runner_restore_timeout_s` the run stops with one error naming the lost env runner, its
    node (id and address, marked dead by Ray) and what a node must offer to host it. With a new
    worker node, `--resume` continues from the last checkpoint to the stop."""
    storage, stop = two_nodes.shared_storage, 12
    args = _train_args(storage, "lost", stop=stop, env_runner_restore_timeout_s=30)
    log = storage / "lost.log"
    storage.mkdir(parents=True, exist_ok=True)
    proc = _start_training(two_nodes, args, log)
    try:
        killed_at = _kill_worker_node_after(two_nodes, storage / "lost", 3, proc, log)
        code = proc.wait(timeout=300)
    finally:
        _stop(proc)
    out = log.read_text()
    assert code == 1, out[-5000:]
    (error,) = [line for line in out.splitlines() if line.startswith("rllib: 1 trial(s) failed")]
    assert re.search(rf"env runner 1 \(pid \d+\) ran on node [0-9a-f]{{56}} at {re.escape(WORKER_IP)}, which Ray "
                     r"marked dead \(health check failed", error), error
    assert "asks a node for {'CPU': 1, 'env_runner_node': 1}, and no live node offers it" in error, error
    before = _results(storage / "lost")
    assert killed_at <= len(before) < stop

    two_nodes.start_worker()
    done = subprocess.run([*args, "--resume"], cwd=REPO, env=two_nodes.env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    after = _results(storage / "lost")
    # Every iteration once, from the first to the stop: the resumed run started after the last
    # checkpoint (one per iteration), with the weight version the checkpoint saved.
    assert [r["training_iteration"] for r in after] == list(range(1, stop + 1))
    assert [r["weights_version"] for r in after] == list(range(1, stop + 1))
    assert all(r["staleness_max"] == 0 for r in after)


def test_worker_node_replaced_in_time_the_env_runner_restarts_there_and_the_run_goes_on(two_nodes):
    """The worker node dies mid-run and a new one offering `env_runner_node` joins within
    `env_runner_restore_timeout_s`: Ray places the env runner's bundle on the new node and
    restarts the runner, GRPO loads the current weights into it, and the run reaches its stop."""
    storage, stop = two_nodes.shared_storage, 12
    storage.mkdir(parents=True, exist_ok=True)
    log = storage / "replaced.log"
    earlier = {a["id"] for a in _actors(two_nodes)}
    proc = _start_training(two_nodes, _train_args(storage, "replaced", stop=stop, env_runner_restore_timeout_s=300), log)
    try:
        _kill_worker_node_after(two_nodes, storage / "replaced", 3, proc, log)
        two_nodes.start_worker()
        code = proc.wait(timeout=400)
    finally:
        _stop(proc)
    assert code == 0, log.read_text()[-5000:]
    results = _results(storage / "replaced")
    assert [r["training_iteration"] for r in results] == list(range(1, stop + 1))
    assert [r["weights_version"] for r in results] == list(range(1, stop + 1))
    assert all(r["staleness_max"] == 0 for r in results)
    assert results[-1]["num_env_runner_restarts"] >= 1
    (runner,) = [a for a in _actors(two_nodes) if a["class"] == "LLMEnvRunner" and a["id"] not in earlier]
    assert runner["restarts"] == 1 and runner["ip"] == WORKER_IP and runner["node_alive"]  # on the new node
