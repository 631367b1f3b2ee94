"""A training script attached to a running Ray cluster, as a user runs one: ``RAY_ADDRESS=<head>
python tests/multinode_driver.py ITERATIONS``.

GRPO on the tiny model with its learner on the node offering ``learner_node`` and its env runner
on the node offering ``env_runner_node`` (``ray_cluster.placed_config``). After each iteration it
prints one JSON line: the iteration and the weight version it published; for the learner and for
the env runner, the node address, the weight version and a SHA-256 of the weights it holds; the
object id of the published weights and the object id the env runner last loaded; and the nodes
whose object store holds the published weights. ``tests/test_multinode.py`` runs it.
"""

from __future__ import annotations

import json
import sys

import ray


def _weights_digest(state_dict) -> str:
    """SHA-256 over the parameter names and their float32 bytes, in name order."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(state_dict):
        digest.update(name.encode())
        digest.update(state_dict[name].detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _runner_view(runner) -> dict:
    """What the env runner holds, read in its own process."""
    import ray

    return {
        "ip": ray.util.get_node_ip_address(),
        "version": runner.weights_version,
        "weights_id": runner._weights_id,
        "digest": _weights_digest(runner.engine.model.state_dict()),
    }


def _learner_view(learner) -> dict:
    """What the learner holds, read in its own process: the version it would publish."""
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    state = learner.get_state(components="rl_module", inference_only=True)
    return {
        "ip": ray.util.get_node_ip_address(),
        "version": state[WEIGHTS_SEQ_NO],
        "digest": _weights_digest(learner.module[DEFAULT_MODULE_ID].unwrapped().model.state_dict()),
    }


def main(iterations: int) -> None:
    from ray_cluster import placed_config

    ray.init(log_to_driver=False)
    nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    algo = placed_config().build_algo()
    try:
        for _ in range(iterations):
            result = algo.train()
            published = algo._rounds.weights
            (runner,) = algo.env_runner_group.foreach_env_runner(_runner_view, local_env_runner=False)
            (learner,) = [r.get() for r in algo.learner_group.foreach_learner(_learner_view)]
            where = ray.experimental.get_object_locations([published.state])[published.state]["node_ids"]
            print(json.dumps({
                "iteration": result["training_iteration"],
                "published_version": published.version,
                "published_id": published.state.hex(),
                "object_store_nodes": sorted(nodes[node_id] for node_id in where),
                "learner": learner,
                "env_runner": runner,
            }), flush=True)
    finally:
        algo.stop()
        ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]))
