"""A Ray cluster of two nodes on this machine, started with ``ray start`` as on real machines.

``TwoNodeCluster`` starts a head node and a worker node, each a raylet of its own with its own
CPUs and a custom resource naming it, on loopback addresses, in a fresh temporary folder and on
free ports, so that it shares nothing with any other Ray on the machine. It stops only the
processes it started: those whose command line names its temporary folder (every Ray process
of a node is given it), found with psutil and killed by pid; never ``ray stop``, which would stop
every Ray on the machine.

Token authentication (Ray's default for ``ray start --head``) stays on: the cluster gets a fresh
token of its own, handed to every ``ray start`` and client through ``RAY_AUTH_TOKEN``
(:meth:`TwoNodeCluster.env`), so that the default token in ``~/.ray`` is neither read nor written.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

#: The custom resource of each node: a learner asks for the head's, an env runner for the worker's.
HEAD_RESOURCE = "learner_node"
WORKER_RESOURCE = "env_runner_node"
#: The nodes' addresses: loopback addresses other than 127.0.0.1, which ``ray start`` would replace
#: with the machine's network address (``services.resolve_ip_for_localhost``); a node of its own
#: address each, as on separate machines.
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"


#: ``rllib train --config`` of a GRPO run on the tiny model (seconds per iteration; the entropy
#: bonus moves the weights every update, also when every reward of the untrained model is 0) with
#: its learner on the head node and its env runner on the worker node; the algorithm's own process
#: (Tune's trial actor) on the head node too, through the resource Ray gives the head node.
TRAIN_CONFIG = {
    "model_name": "tiny-random", "max_response_length": 16, "group_size": 4, "prompts_per_step": 4,
    "env_config": {"data": "sql_synth/test"}, "entropy_coeff": 0.01,
    "num_learners": 1, "num_cpus_per_learner": 1, "custom_resources_per_learner": {HEAD_RESOURCE: 1},
    "num_env_runners": 1, "num_cpus_per_env_runner": 1, "custom_resources_per_env_runner": {WORKER_RESOURCE: 1},
    "custom_resources_for_main_process": {"node:__internal_head__": 0.01},
}


def placed_config():
    """``TRAIN_CONFIG`` through the Python API: the same run, learner and env runner placement
    (the algorithm runs in the script's own process)."""
    from rllib_dph.algorithms.grpo import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=16)
        .training(group_size=4, prompts_per_step=4, entropy_coeff=0.01)
        .learners(num_learners=1, num_cpus_per_learner=1, custom_resources_per_learner={HEAD_RESOURCE: 1})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1,
                     custom_resources_per_env_runner={WORKER_RESOURCE: 1})
    )


def free_port() -> int:
    """A TCP port no process listens on now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class TwoNodeCluster:
    """A head node (``HEAD_RESOURCE``) and a worker node (``WORKER_RESOURCE``) on loopback.

    Args:
        num_cpus: CPUs each node offers (Ray's accounting; both share this machine's cores).
        object_store_bytes: Object store size of each node.
    """

    def __init__(self, num_cpus: float = 2, object_store_bytes: int = 300 * 1024**2):
        self.num_cpus, self.object_store_bytes = num_cpus, object_store_bytes
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rdph_mn_"))
        self.log_dir = self.temp_dir / "ray_start_logs"
        self.log_dir.mkdir()
        #: A storage path every node reaches (all run on this machine), for ``--storage-path``.
        self.shared_storage = self.temp_dir / "storage"
        self.token = secrets.token_hex(32)
        self.port = free_port()
        self.address = f"{HEAD_IP}:{self.port}"
        self._workers = 0

    # ------------------------------------------------------------------ environment
    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process of this cluster: ``RAY_ADDRESS`` and the token."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        env.update(RAY_ADDRESS=self.address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, **extra)
        return env

    # ------------------------------------------------------------------ nodes
    def _ray_start(self, name: str, ip: str, *args: str) -> None:
        """``ray start <args>`` of a node at ``ip`` with this cluster's folder and free ports."""
        command = [
            str(Path(sys.executable).with_name("ray")), "start", *args,
            f"--node-ip-address={ip}", f"--temp-dir={self.temp_dir}",
            f"--num-cpus={self.num_cpus}", f"--object-store-memory={self.object_store_bytes}",
            "--min-worker-port=0", "--max-worker-port=0",
            "--dashboard-agent-listen-port=0", "--dashboard-agent-grpc-port=0",
            "--metrics-export-port=0", "--runtime-env-agent-port=0",
            "--disable-usage-stats",
        ]
        log = self.log_dir / f"{name}.log"
        with log.open("w") as out:
            done = subprocess.run(command, env=self.env(), stdout=out, stderr=subprocess.STDOUT, timeout=120)
        if done.returncode:
            raise RuntimeError(f"`{' '.join(command)}` exited {done.returncode}:\n{log.read_text()[-3000:]}")

    def start_head(self, attempts: int = 3) -> None:
        """The head node, offering ``HEAD_RESOURCE``. The GCS port was free when chosen; another
        program may take it before the GCS binds it, so a failed start is retried on a new port
        after its processes are killed."""
        for attempt in range(1, attempts + 1):
            try:
                self._ray_start(
                    "head", HEAD_IP, "--head", f"--port={self.port}", "--include-dashboard=false", "--dashboard-port=0",
                    f"--ray-client-server-port={free_port()}", f'--resources={{"{HEAD_RESOURCE}": 1}}',
                )
                return
            except RuntimeError:
                _kill(self.processes())
                if attempt == attempts:
                    raise
                self.port = free_port()
                self.address = f"{HEAD_IP}:{self.port}"

    def start_worker(self) -> None:
        """A worker node joined to the head, offering ``WORKER_RESOURCE``."""
        self._workers += 1
        self._ray_start(f"worker{self._workers}", WORKER_IP, f"--address={self.address}", f'--resources={{"{WORKER_RESOURCE}": 1}}')

    # ------------------------------------------------------------------ processes
    def processes(self) -> list[psutil.Process]:
        """This cluster's processes: those whose command line names its temporary folder (Ray
        gives it to every process of a node it starts: GCS, raylet, monitors), and their
        descendants (Ray's workers and agents, whose command lines may not name it)."""
        marker = str(self.temp_dir)
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(marker in part for part in proc.info["cmdline"] or ()):
                    found.update({p.pid: p for p in [proc, *proc.children(recursive=True)]})
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return list(found.values())

    def raylet(self, ip: str) -> psutil.Process:
        """The running raylet of the node at ``ip``."""
        for proc in self.processes():
            try:
                cmdline = proc.cmdline()
                if cmdline and cmdline[0].endswith("/raylet") and f"--node_ip_address={ip}" in cmdline:
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        return proc
            except psutil.NoSuchProcess:
                continue
        raise LookupError(f"no running raylet at {ip} among this cluster's processes")

    def worker_alive(self) -> bool:
        """Whether a worker node's raylet is running."""
        try:
            self.raylet(WORKER_IP)
            return True
        except LookupError:
            return False

    def stop(self) -> None:
        """Kills this cluster's processes and removes its folder."""
        _kill(self.processes())
        _kill(self.processes())  # any a dying raylet started meanwhile
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill(procs: list[psutil.Process]) -> None:
    """SIGTERM to ``procs``, then SIGKILL to those alive after 10 s."""
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
