"""Sampling rounds on the env runners: synchronous, or up to ``max_staleness`` rounds ahead of
the learner; weight versions, the staleness bound, timeouts and restarts of dead env runners.

RLlib's asynchronous algorithms (IMPALA, APPO) do not fit LLM rollouts: they cut train batches by
env steps (a GRPO group must stay whole, and DPH adds its D_pef rows in the learner) and bound
requests in flight, not the weight versions a sample may be behind. So GRPO keeps its own
``training_step`` and reuses RLlib's parts: the env runner group's ``FaultTolerantActorManager``
(asynchronous requests, health tracking), Ray's actor restarts
(``fault_tolerance(restart_failed_env_runners=..., max_num_env_runner_restarts=...)``),
``env_runners(sample_timeout_s=...)``, ``fault_tolerance(env_runner_restore_timeout_s=...)``, and
``WEIGHTS_SEQ_NO`` (the learner's update count, in its checkpoint) as the weight version.

Contract: every sampling request carries the published weights (a version and an object ref; a
runner holding another version loads them first, so a restarted runner never samples with its
initial weights) and the sampling position the runner samples from (the driver keeps each
runner's, so a restarted runner continues where it stood, not at its first prompts), every row
carries the version it was sampled with (``columns.WEIGHT_VERSION``), and every blocking wait
raises an error naming the env runner, the weight version and the timeout. The bounds are
taken from the driver: an engine's ``generate`` runs in the runner's own thread, which Python
cannot interrupt, so ``sample_timeout_s`` and ``weight_sync_timeout_s`` bound the runner's whole
call, and a runner stuck that way stops the run (alive, so Ray would not restart it). The
learners' timeouts: ``rllib_dph.learners.remote_calls`` and ``rllib_dph.learners.collectives``
(docs/faults.md).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from rllib_dph import columns as C
from rllib_dph.rollout.batch import select_rows

logger = logging.getLogger(__name__)

#: Result keys (top level of an iteration's results).
NUM_STALE_ROWS_DROPPED = "num_stale_rows_dropped"
STALENESS_MEAN = "staleness_mean"
STALENESS_MAX = "staleness_max"
WEIGHTS_VERSION = "weights_version"
NUM_ENV_RUNNER_RESTARTS = "num_env_runner_restarts"

#: Seconds between health probes while no env runner is in service.
_PROBE_PAUSE_S = 1.0


@dataclass(frozen=True)
class PublishedWeights:
    """One version of the policy weights, put once into Ray's object store.

    Attributes:
        version: RLlib's ``WEIGHTS_SEQ_NO`` of the learner state: updates applied so far.
        state: Object ref of ``{"rl_module": weights, WEIGHTS_SEQ_NO: version}``
            (``LLMEnvRunner.load_weights`` reads it; a new ref for every publication).
    """

    version: int
    state: Any


@dataclass(frozen=True)
class RunnerPlace:
    """Where an env runner runs: its Ray node and process, read while it is in service.

    Attributes:
        node_id: Ray node id (hex).
        ip: The node's address.
        pid: The env runner's process id.
    """

    node_id: str
    ip: str
    pid: int


def runner_place(runner) -> RunnerPlace:
    """The :class:`RunnerPlace` of ``runner``, called in the env runner's own process."""
    return RunnerPlace(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid())


@dataclass
class Round:
    """Sampling requests sent together: one share of prompts per env runner.

    Attributes:
        tag: The actor manager's tag of these requests (unique per round).
        shares: Env runner id → number of prompts.
        weights: The weights the round was requested with.
        starts: Env runner id → the sampling position its share is sampled from.
        results: The env runners' ``(batch, metrics, info)`` once collected ahead of its step
            (:meth:`SamplingRounds.rounds_ahead`), else None.
    """

    tag: str
    shares: dict[int, int]
    weights: PublishedWeights
    starts: dict[int, dict[str, int]]
    results: Optional[list[tuple]] = None


#: The sampling position (``LLMEnvRunner.sampling_position``) of a runner that has sampled nothing yet.
START_POSITION = {"prompts_taken": 0, "num_calls": 0}


def position_after(position: dict[str, int], num_prompts: int) -> dict[str, int]:
    """The sampling position after one ``LLMEnvRunner.sample`` call of ``num_prompts`` prompts from
    ``position`` (it takes that many prompts and counts one call): the driver knows where a
    request leaves a runner before the request returns."""
    return {"prompts_taken": int(position["prompts_taken"]) + num_prompts, "num_calls": int(position["num_calls"]) + 1}


def split_prompts(num_prompts: int, runner_ids: list[int]) -> dict[int, int]:
    """Spreads ``num_prompts`` over the env runners in id order, the first ones one more when it
    does not divide; runners left with no prompt get no request."""
    size = len(runner_ids)
    shares = {rid: num_prompts // size + (rank < num_prompts % size) for rank, rid in enumerate(runner_ids)}
    return {rid: n for rid, n in shares.items() if n > 0}


def drop_stale_rows(
    batch: dict[str, np.ndarray], version: int, max_staleness: int
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """The rows of a rollout batch within the staleness bound, ``WEIGHT_VERSION`` kept.

    A row's staleness is ``version - WEIGHT_VERSION``: the learner updates it was sampled
    before. Rows with staleness in ``[0, max_staleness]`` are kept; older rows and rows from a
    version the learner never had (negative staleness, e.g. sampled before an older checkpoint
    was restored) are dropped. All rows of a group share one version, so groups stay whole.
    The column stays until the step's rows are chosen (:meth:`SamplingRounds.strip_versions`).

    Returns:
        ``(kept batch, staleness of the kept rows (B_kept,), rows dropped)``.
    """
    staleness = version - batch[C.WEIGHT_VERSION]  # (B,)
    keep = (staleness >= 0) & (staleness <= max_staleness)
    if keep.all():
        return dict(batch), staleness, 0
    return select_rows(batch, keep), staleness[keep], int((~keep).sum())


def publish_weights(state: dict) -> PublishedWeights:
    """A learner's weights and version (its state's ``rl_module`` and ``WEIGHTS_SEQ_NO``:
    ``remote_calls.read_learner_weights``), put once into the object store, its tensors as
    numpy arrays (:func:`as_arrays`)."""
    version = int(state.get(WEIGHTS_SEQ_NO, 0))
    payload = {COMPONENT_RL_MODULE: as_arrays(state[COMPONENT_RL_MODULE]), WEIGHTS_SEQ_NO: version}
    return PublishedWeights(version=version, state=ray.put(payload))


def as_arrays(tree: Any) -> Any:
    """``tree`` (nested dicts) with its CPU torch tensors as numpy arrays sharing their memory.

    Ray's object store takes numpy arrays as pickle-5 out-of-band buffers (one memory copy in,
    none out) but pickles a torch tensor through torch's own serialisation, about 4x slower for
    a weight sync (docs/results/costs.md, "Engines and weight sync"). bfloat16 tensors, which
    numpy cannot hold, stay tensors. The engines' ``update_weights`` take either.
    """
    if isinstance(tree, dict):
        return {key: as_arrays(value) for key, value in tree.items()}
    if isinstance(tree, torch.Tensor) and tree.device.type == "cpu" and tree.dtype != torch.bfloat16:
        return tree.detach().numpy()
    return tree


class SamplingRounds:
    """The env runners' sampling rounds and weights for one algorithm.

    ``max_staleness = 0``: a round is requested when the step needs it and waited for, and the
    new weights are pushed to every env runner after each update (the synchronous loop).
    ``max_staleness = k > 0``: ``k`` rounds stay requested ahead, each with the weights current
    when it was requested, so the env runners sample while the learners update; rows older than
    ``k`` versions are dropped. Remote env runners only (``num_env_runners >= 1``); with
    ``num_env_runners = 0`` the driver's local env runner samples in-process.

    The driver owns each remote runner's sampling position (:attr:`positions`): a request takes
    the runner's position and advances it (:func:`position_after`). A share that failed
    with its runner is sampled again by that runner from the position it was requested at, with
    the round's weights, once Ray restarted it (the same rows as without the failure); when the
    runner is not back in service, the runners in service sample as many prompts from their own
    positions, and the dead runner's prompts of that share are skipped, never repeated.

    Args:
        group: The algorithm's ``EnvRunnerGroup``.
        config: The algorithm config (``max_staleness``, ``sample_timeout_s``,
            ``weight_sync_timeout_s``, RLlib's ``fault_tolerance`` fields).
        metrics: The algorithm's ``MetricsLogger``.
    """

    def __init__(self, group, config, metrics):
        self.group, self.config, self.metrics = group, config, metrics
        self.weights: Optional[PublishedWeights] = None
        self._pending: collections.deque[Round] = collections.deque()
        self._num_rounds = 0
        #: Remote env runner id -> the sampling position its next request samples from.
        self.positions: dict[int, dict[str, int]] = {}
        self._places: dict[int, RunnerPlace] = {}  # env runner id -> where it ran when it took weights
        self._failures: dict[int, str] = {}  # out-of-service env runner id -> the error that took it out

    # ------------------------------------------------------------------ weights
    def publish(self, state: dict) -> PublishedWeights:
        """Publishes a learner's weights (``remote_calls.read_learner_weights``): the next
        requests carry them."""
        self.weights = publish_weights(state)
        self.metrics.log_value(WEIGHTS_VERSION, self.weights.version, window=1)
        return self.weights

    def push(self, runner_ids: Optional[list[int]] = None) -> None:
        """Loads the published weights into the env runners (all, or ``runner_ids``) and waits.

        Raises:
            TimeoutError: An env runner did not take the version within ``weight_sync_timeout_s``.
        """
        local = self.group.local_env_runner
        if local is not None and runner_ids is None:
            local.load_weights(self.weights)
        ids = self.group.healthy_env_runner_ids() if runner_ids is None else runner_ids
        if not ids:
            return
        timeout = self.config.weight_sync_timeout_s
        results = self._manager.foreach_actor(
            "load_weights", kwargs={"weights": self.weights}, remote_actor_ids=ids, timeout_seconds=timeout
        )
        answered = {r.actor_id for r in results}
        for r in results:
            if not r.ok:  # it died: out of service until restored, its share goes elsewhere
                self._failures[r.actor_id] = _cause(r.get())
                logger.warning(
                    "env runner %d failed to take weight version %d: %s", r.actor_id, self.weights.version, r.get()
                )
        late = [rid for rid in ids if rid not in answered]
        if late:
            raise TimeoutError(
                f"env runner(s) {late} did not take weight version {self.weights.version} within "
                f"weight_sync_timeout_s={timeout} s. The runner is stuck or too slow to load the "
                "weights: check its log (ray logs), or raise config.env_runners("
                "weight_sync_timeout_s=...)."
            )
        self._locate([r.actor_id for r in results if r.ok and r.actor_id not in self._places])

    def _locate(self, ids: list[int]) -> None:
        """Reads where the env runners ``ids`` run, for an error that names a lost node."""
        if ids:
            timeout = self.config.weight_sync_timeout_s
            for r in self._manager.foreach_actor(runner_place, remote_actor_ids=ids, timeout_seconds=timeout):
                if r.ok:
                    self._places[r.actor_id] = r.get()

    # ------------------------------------------------------------------ restarts
    def restore(self) -> list[int]:
        """Brings env runners that Ray restarted back into service holding the published weights
        and their version; counts them (``num_env_runner_restarts``)."""
        restored = self.group.probe_unhealthy_env_runners() if self.group.num_remote_env_runners() else []
        for rid in restored:  # Ray may have placed it on another node
            self._places.pop(rid, None)
            self._failures.pop(rid, None)
        if restored and self.weights is not None:
            self.push(sorted(restored))
        self._count_restarts(len(restored))
        return restored

    def _count_restarts(self, n: int) -> None:
        self.metrics.log_value(NUM_ENV_RUNNER_RESTARTS, n, reduce="lifetime_sum")

    def _await_healthy(self, failures: dict[int, str]) -> list[int]:
        """Healthy env runner ids; with none, probes until Ray restarted one or
        ``env_runner_restore_timeout_s`` passed, then raises naming the lost runners, the nodes
        they ran on (and whether Ray marked them dead) and what a node must offer to host one."""
        self._failures.update(failures)
        timeout = self.config.env_runner_restore_timeout_s
        deadline = time.monotonic() + timeout
        waiting = False
        while not self.group.healthy_env_runner_ids():
            if not waiting:
                waiting = True
                logger.warning("no env runner in service, waiting up to env_runner_restore_timeout_s=%s s for "
                               "Ray to restart one: %s", timeout, self._describe_lost())
            if time.monotonic() > deadline:
                raise RuntimeError(f"no env runner came back within env_runner_restore_timeout_s={timeout} s: "
                                   f"{self._describe_lost()}. {self._where_to_restart()}")
            if not self.restore():
                time.sleep(_PROBE_PAUSE_S)
        return sorted(self.group.healthy_env_runner_ids())

    def _describe_lost(self) -> str:
        """Each out-of-service env runner: its pid and node (id, address, whether Ray marked the
        node dead and why) when known, and the error that took it out."""
        nodes = {node["NodeID"]: node for node in ray.nodes()}
        healthy = set(self.group.healthy_env_runner_ids())
        parts = []
        for rid in sorted(set(self._manager.actor_ids()) - healthy):
            place, text = self._places.get(rid), f"env runner {rid}"
            if place is not None:
                node = nodes.get(place.node_id, {})
                state = ("which Ray marked dead (" + node.get("DeathReasonMessage", "") + ")" if not node.get("Alive", True)
                         else "which Ray lists alive")
                text += f" (pid {place.pid}) ran on node {place.node_id} at {place.ip}, {state}"
            cause = self._failures.get(rid, "no error reported")[:300]
            parts.append(f"{text}; its error: {cause}")
        return "; ".join(parts) or "none reported, all out of service"

    def _where_to_restart(self) -> str:
        """Which live nodes offer what an env runner asks for (its CPUs, GPUs and custom
        resources), and what to do when none does."""
        cfg = self.config
        need = {"CPU": cfg.num_cpus_per_env_runner, "GPU": cfg.num_gpus_per_env_runner, **cfg.custom_resources_per_env_runner}
        need = {name: amount for name, amount in need.items() if amount}
        hosts = [node["NodeManagerAddress"] for node in ray.nodes()
                 if node["Alive"] and all(node["Resources"].get(name, 0) >= amount for name, amount in need.items())]
        if hosts:
            return (f"Live nodes offer what an env runner asks for ({need}): {', '.join(hosts)}. Ray restarts a runner "
                    f"at most max_num_env_runner_restarts={cfg.max_num_env_runner_restarts} times; check the "
                    "runners' logs (ray logs).")
        custom = cfg.custom_resources_per_env_runner
        resources = f" --resources='{json.dumps(custom)}'" if custom else ""
        return (f"An env runner asks a node for {need}, and no live node offers it. Start a node that does (ray start "
                f"--address={ray.get_runtime_context().gcs_address}{resources} with enough CPUs and GPUs) "
                "and continue from the last checkpoint (rllib train --resume, or Algorithm.from_checkpoint); with "
                "such a node up within env_runner_restore_timeout_s, Ray restarts the env runner there and the run "
                "goes on.")

    # ------------------------------------------------------------------ rounds
    def next_round(self, num_prompts: int) -> tuple[list[dict[str, np.ndarray]], list[dict]]:
        """The next round's batches (stale rows dropped, ``WEIGHT_VERSION`` kept) and the env
        runners' metrics; in asynchronous mode, first requests rounds to keep ``max_staleness``
        of them ahead."""
        if self.group.num_remote_env_runners() == 0:
            return self._sample_locally(num_prompts)
        current = self._pending.popleft() if self._pending else self._request(num_prompts)
        while len(self._pending) < self.config.max_staleness:
            self._pending.append(self._request(num_prompts))
        results = current.results if current.results is not None else self._collect_with_retry(current)
        batches, metrics = [], []
        for batch, runner_metrics, info in results:
            batches.append(self._drop_stale(batch))
            metrics.append(runner_metrics)
            self._count_restarts(int(info["restarted"]))
        if not any(len(b[C.REWARDS]) for b in batches):  # every row too old: one fresh round
            fresh = self._collect_with_retry(self._request(num_prompts))
            batches = [self._drop_stale(batch) for batch, _, _ in fresh]
        return batches, metrics

    def _sample_locally(self, num_prompts: int):
        batch, metrics, _ = self.group.local_env_runner.sample_round(num_prompts=num_prompts, weights=self.weights)
        return [self._drop_stale(batch)], [metrics]

    def _drop_stale(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch, _, dropped = drop_stale_rows(batch, self.weights.version, self.config.max_staleness)
        self.metrics.log_value(NUM_STALE_ROWS_DROPPED, dropped, reduce="sum")
        self.metrics.log_value(NUM_STALE_ROWS_DROPPED + "_lifetime", dropped, reduce="lifetime_sum")
        return batch

    def strip_versions(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The step's chosen rows without ``WEIGHT_VERSION`` (the learner never sees it); logs
        their staleness (``staleness_mean`` / ``staleness_max``), however many rounds (dynamic
        sampling) they came from."""
        batch = dict(batch)
        staleness = self.weights.version - batch.pop(C.WEIGHT_VERSION)  # (B,)
        if len(staleness):
            self.metrics.log_value(STALENESS_MEAN, float(staleness.mean()), window=1)
            self.metrics.log_value(STALENESS_MAX, int(staleness.max()), window=1)
        return batch

    def _request(self, num_prompts: int, runner_ids: Optional[list[int]] = None,
                 weights: Optional[PublishedWeights] = None) -> Round:
        """Sends one round's requests, carrying the published weights (or ``weights``) and each
        runner's position, which it advances."""
        shares = split_prompts(num_prompts, runner_ids or self._await_healthy({}))
        starts = {rid: self.positions.get(rid, START_POSITION) for rid in shares}
        self.positions.update({rid: position_after(starts[rid], n) for rid, n in shares.items()})
        return self._send(shares, starts, weights or self.weights)

    def _send(self, shares: dict[int, int], starts: dict[int, dict[str, int]], weights: PublishedWeights) -> Round:
        """Sends the requests of ``shares``, each sampled from its runner's ``starts`` position."""
        self._num_rounds += 1
        rnd = Round(tag=f"rllib_dph_round_{self._num_rounds}", shares=shares, weights=weights, starts=starts)
        self.group.foreach_env_runner_async(
            "sample_round",
            tag=rnd.tag,
            kwargs=[{"num_prompts": n, "weights": weights, "position": starts[rid]} for rid, n in shares.items()],
            remote_worker_ids=list(shares),
        )
        return rnd

    def _collect(self, rnd: Round) -> tuple[list[tuple[int, Any]], dict[int, str]]:
        """Waits up to ``sample_timeout_s`` for a round: ([(runner id, result)] in id order,
        {runner id: cause} of the failed). Raises ``TimeoutError`` naming runners still sampling."""
        timeout = self.config.sample_timeout_s
        manager = self._manager
        results = manager.fetch_ready_async_reqs(tags=[rnd.tag], timeout_seconds=timeout)
        done = {r.actor_id: r.get() for r in results if r.ok}
        failures = {r.actor_id: _cause(r.get()) for r in results if not r.ok}
        missing = [rid for rid in rnd.shares if rid not in done and rid not in failures]
        # The manager forgets every request of a runner it marks unhealthy (another round's
        # failure): such a request is neither returned nor in flight.
        late = [rid for rid in missing if manager._remote_actor_states[rid].get_num_in_flight_requests(rnd.tag)]
        failures.update({rid: "the env runner died while the request was in flight" for rid in missing if rid not in late})
        if late:
            raise TimeoutError(
                f"env runner(s) {late} did not return their share of a sampling round (weight "
                f"version {rnd.weights.version}) within sample_timeout_s={timeout} s. The runner "
                "is stuck (engine, verifier) or too slow: check its log (ray logs), or raise "
                "config.env_runners(sample_timeout_s=...)."
            )
        return sorted(done.items()), failures

    def _collect_with_retry(self, rnd: Round) -> list[tuple]:
        """A round's results. The shares of env runners that failed are sampled once more, with
        the round's weights: each by its own runner from the position it was requested at when
        Ray restarted every failed runner, else by the runners in service from their positions
        (a restarted one included); a second failure, or a failure with restarts off, raises
        naming the runners and the causes."""
        done, failures = self._collect(rnd)
        self._failures.update(failures)
        if failures:
            if not self.config.restart_failed_env_runners:
                raise RuntimeError(
                    f"env runner(s) failed while sampling: {_describe(failures)}; "
                    "restart_failed_env_runners=False, so the run stops. Turn it on with "
                    "config.fault_tolerance(restart_failed_env_runners=True)."
                )
            self.restore()
            ids = self._await_healthy(failures)
            if set(failures) <= set(ids):
                retry = self._send({rid: rnd.shares[rid] for rid in failures}, rnd.starts, rnd.weights)
            else:
                retry = self._request(sum(rnd.shares[rid] for rid in failures), ids, weights=rnd.weights)
            retried, again = self._collect(retry)
            if again:
                raise RuntimeError(
                    f"env runner(s) failed again on the retry of a sampling round: {_describe(again)} "
                    f"(first failure: {_describe(failures)}). Retries are exhausted: a failed share "
                    "is sampled once more, then the run stops; check the runners' logs."
                )
            done += retried
        return [result for _, result in done]

    @property
    def _manager(self):
        """The env runner group's actor manager. Its results keep each runner's id and error,
        which the group's own calls log and drop (a private RLlib attribute, read here only)."""
        return self.group._worker_manager

    def discard_pending(self) -> int:
        """Waits for and discards the rounds requested ahead (on restoring a checkpoint: their rows
        come from weights the restored run never had); returns how many were discarded."""
        num = len(self._pending)
        for rnd in self._pending:
            if rnd.results is None:
                self._manager.fetch_ready_async_reqs(tags=[rnd.tag], timeout_seconds=self.config.sample_timeout_s)
        self._pending.clear()
        return num

    def rounds_ahead(self) -> list[list[tuple]]:
        """The rounds requested ahead, oldest first, each as its env runners' ``(batch, metrics,
        info)``: waits for them (``sample_timeout_s``, failed shares sampled again as
        :meth:`next_round` does) and keeps them for the steps they belong to. A checkpoint holds
        them, so a resumed run trains on the rows the uninterrupted run trains on."""
        for rnd in self._pending:
            if rnd.results is None:
                rnd.results = self._collect_with_retry(rnd)
        return [rnd.results for rnd in self._pending]

    def keep_rounds_ahead(self, rounds: list[list[tuple]]) -> None:
        """Makes ``rounds`` (:meth:`rounds_ahead` of a checkpoint) the next rounds that
        :meth:`next_round` returns, after any round already pending; the driver's local env
        runner (no remote ones) samples every round itself and takes none."""
        if self.group.num_remote_env_runners():
            self._pending.extend(Round(tag="", shares={}, weights=self.weights, starts={}, results=list(results))
                                 for results in rounds)


def _cause(error: BaseException) -> str:
    """``TypeName: message`` of a failed call's error, on one line."""
    return " ".join(f"{type(error).__name__}: {error}".split())


def _describe(failures: dict[int, str]) -> str:
    """``env runner 1: <cause>; ...``, each cause cut to its first 300 characters."""
    return "; ".join(f"env runner {rid}: {cause[:300]}" for rid, cause in sorted(failures.items()))
