"""Learner updates with a timeout, and errors that name the learner that failed and its log.

RLlib 2.60's ``LearnerGroup.update`` waits for its remote learners without a timeout
(``FaultTolerantActorManager.foreach_actor`` with ``timeout_seconds=None``) and, when a learner
actor died, raises Ray's bare ``RayActorError``; RLlib restarts env runners
(``fault_tolerance(restart_failed_env_runners=...)``) but has no restart for learners, whose
optimizer state and DDP process group cannot be rebuilt mid-run. So for remote learners GRPO sends
the update itself, through the learner group's own actor manager (its asynchronous requests, the
calls IMPALA uses), and waits at most ``learner_update_timeout_s``; the first learner that fails
ends the run at once, with its index, actor id, pid and the last lines of its Ray worker log. The
run then continues from the last checkpoint (``Algorithm.from_checkpoint``, Tune's ``--resume``).
"""

from __future__ import annotations

import functools
import glob
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import ray
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.utils.annotations import override

#: Lines of a learner's Ray worker log quoted in the error.
LOG_TAIL_LINES = 20
#: Longest single wait for learner results; the loop then looks for failures and the deadline.
_POLL_S = 1.0


@dataclass(frozen=True)
class LearnerActor:
    """Where one remote learner runs (read once, while it is alive)."""

    index: int
    actor_id: str
    pid: int

    def describe(self) -> str:
        return f"learner {self.index} (actor {self.actor_id}, pid {self.pid})"


class LearnerFailed(RuntimeError):
    """A remote learner died or raised during an update."""


def learner_actors(learner_group) -> dict[int, LearnerActor]:
    """The remote learners by their actor manager id (empty for a local learner)."""
    if learner_group.is_local:
        return {}

    def where(learner):
        return learner._learner_index, ray.get_runtime_context().get_actor_id(), os.getpid()

    results = learner_group._worker_manager.foreach_actor(where)
    return {r.actor_id: LearnerActor(*r.get()) for r in results if r.ok}


def log_tail(pid: int, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the Ray worker logs (``worker-*-<pid>.err`` / ``.out`` in the
    session's logs folder) of process ``pid``; a note when there are none."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return "(no Ray session in this process: no worker log to read)"
    paths = sorted(glob.glob(os.path.join(node.get_logs_dir_path(), f"worker-*-{pid}.*")))
    paths = [p for p in paths if p.endswith((".err", ".out")) and os.path.getsize(p)]
    if not paths:
        return f"(no worker log of pid {pid} under {node.get_logs_dir_path()})"
    parts = []
    for path in paths:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 64 * 1024))
            tail = f.read().decode(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts)


def update_remote_learners(
    learner_group, batches: list, *, timeout_s: float, actors: dict[int, LearnerActor], **kwargs
) -> list[dict[str, Any]]:
    """``LearnerGroup.update`` on remote learners, one batch per learner, waited for at most
    ``timeout_s`` (``learner_update_timeout_s``).

    Raises:
        LearnerFailed: A learner died or raised; names it and quotes its worker log.
        TimeoutError: A learner did not finish in time; names the learners still updating.
    """
    from ray.rllib.core.learner.training_data import TrainingData

    manager = learner_group._worker_manager
    ids = manager.actor_ids()
    tag = f"rllib_dph_update_{time.monotonic_ns()}"
    calls = [dict(training_data=TrainingData(batch=b), **kwargs) for b in batches]
    if manager.foreach_actor_async("update", tag=tag, kwargs=calls, remote_actor_ids=ids) < len(ids):
        raise LearnerFailed(
            f"the learner update could not be sent to every learner: {_names(ids, actors, manager)}. A "
            "learner whose earlier call failed is out of service, and one still busy with a call that "
            "timed out takes no new one; learners are not restarted: continue from the last "
            "checkpoint (Algorithm.from_checkpoint, or rllib train --resume)."
        )
    done = _wait(manager, tag, ids, actors, timeout_s, "the learner update", ("learners", "learner_update_timeout_s"))
    return [done[i] for i in ids]


def read_learner_weights(learner_group, *, timeout_s: float, actors: dict[int, LearnerActor]) -> dict[str, Any]:
    """The learner's RLModule weights for inference and their version (its state's
    ``rl_module`` and ``WEIGHTS_SEQ_NO``), read as :func:`read_learner_state` reads, waited for at
    most ``timeout_s`` (``weight_sync_timeout_s``: reading the weights is the first half of the
    weight sync).

    Raises:
        LearnerFailed: A learner died or raised; names it and quotes its worker log.
        TimeoutError: It did not answer in time.
    """
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    component = COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE
    if learner_group.is_local:
        return learner_group.get_state(components=component, inference_only=True)[COMPONENT_LEARNER]
    return read_learner_state(
        learner_group, learner_group._get_subcomponents(COMPONENT_LEARNER, component), timeout_s=timeout_s,
        actors=actors, what="reading the learner's weights", field=("env_runners", "weight_sync_timeout_s"),
        inference_only=True,
    )


def read_learner_state(learner_group, components, *, timeout_s: float, actors: dict[int, LearnerActor], what: str,
                       field: tuple[str, str], **kwargs) -> dict[str, Any]:
    """A remote learner's ``get_state(components, **kwargs)``, read as RLlib's
    ``LearnerGroup.get_state`` reads it (the first learner; every learner when the group
    ``gathers_state_from_all``, i.e. FSDP2 shards, whose gather is a collective, keeping rank 0's
    full state), waited for at most ``timeout_s`` (the setting ``field`` names).

    Raises:
        LearnerFailed: A learner died or raised; names it and quotes its worker log.
        TimeoutError: It did not answer in time.
    """
    manager = learner_group._worker_manager
    ids = manager.actor_ids() if getattr(learner_group, "gathers_state_from_all", False) else manager.healthy_actor_ids()[:1]
    if not ids:
        raise LearnerFailed(f"no learner in service for {what}: {_names(manager.actor_ids(), actors, manager)}.")
    read = functools.partial(_rank_and_state, components=components, **kwargs)
    tag = f"rllib_dph_state_{time.monotonic_ns()}"
    manager.foreach_actor_async(read, tag=tag, remote_actor_ids=ids)
    done = _wait(manager, tag, ids, actors, timeout_s, what, field)
    states = dict(done.values())  # rank -> state
    return states[0] if len(states) > 1 else next(iter(states.values()))


def _rank_and_state(learner, components, **kwargs) -> tuple[int, dict]:
    """(this learner's torch.distributed rank, 0 without a process group; its state)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return rank, learner.get_state(components, **kwargs)


class BoundedLearnerGroup(LearnerGroup):
    """RLlib's learner group whose state reads wait at most ``learner_update_timeout_s``.

    RLlib's ``LearnerGroup.get_state`` (what a checkpoint saves) waits on its learner without a
    timeout, and its ``save_to_path`` has the learner actor read its own state. Here the state
    is read through :func:`read_learner_state` (a learner that is stuck or dead is named, with the
    setting), and ``save_to_path`` writes that state. Restoring is RLlib's.
    """

    #: Whether reading a state needs every learner (FSDP2 shards; ``sharding.ShardedLearnerGroup``).
    gathers_state_from_all = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        #: The remote learners by actor id, read once while they are alive: every error about a
        #: learner (an update, a weight read, a state read) names it from here.
        self.actors = learner_actors(self)

    @override(LearnerGroup)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        from ray.rllib.core import COMPONENT_LEARNER

        if self.is_local or not self._check_component(COMPONENT_LEARNER, components, not_components):
            return super().get_state(components, not_components=not_components, **kwargs)
        state = read_learner_state(
            self, self._get_subcomponents(COMPONENT_LEARNER, components),
            not_components=self._get_subcomponents(COMPONENT_LEARNER, not_components),
            timeout_s=self.config.learner_update_timeout_s, actors=self.actors,
            what="reading the learner's state", field=("learners", "learner_update_timeout_s"), **kwargs,
        )
        return {COMPONENT_LEARNER: state}

    @override(LearnerGroup)
    def save_to_path(self, path=None, *, state: Optional[dict] = None, **kwargs):
        """Saves the state read by :meth:`get_state` (RLlib's would have the learner read it)."""
        return super().save_to_path(path, state=state if state is not None else self.get_state(), **kwargs)


def _wait(manager, tag: str, ids: list[int], actors: dict[int, LearnerActor], timeout_s: float, what: str,
          setting: tuple[str, str]) -> dict[int, Any]:
    """The results of the calls ``tag`` of learners ``ids``, by actor id, waited for at most
    ``timeout_s``; the first failure raises :class:`LearnerFailed`, the deadline ``TimeoutError``,
    both naming ``what`` was waited for (and ``setting``, (config setter, field), that bounds it)."""
    setter, field = setting
    done, deadline = {}, time.monotonic() + timeout_s
    while len(done) < len(ids):
        wait = min(_POLL_S, max(0.0, deadline - time.monotonic()))
        for r in manager.fetch_ready_async_reqs(tags=[tag], timeout_seconds=wait):
            if not r.ok:
                raise _failure(actors.get(r.actor_id), r.actor_id, r.get(), what)
            done[r.actor_id] = r.get()
        if len(done) < len(ids) and time.monotonic() >= deadline:
            late = [_name(i, actors) for i in ids if i not in done]
            raise TimeoutError(
                f"{', '.join(late)} did not finish {what} within {field}={timeout_s} s. A learner is "
                "stuck (a collective waiting for a dead peer, a hung device) or too slow: check its "
                f"log (ray logs), or raise config.{setter}({field}=...)."
            )
    return done


def _name(actor_id: int, actors: dict[int, LearnerActor]) -> str:
    return actors[actor_id].describe() if actor_id in actors else f"learner actor {actor_id}"


def _names(ids: list[int], actors: dict[int, LearnerActor], manager) -> str:
    """Each learner named with its state: in service (with requests in flight) or out of it."""
    states = []
    for i in ids:
        healthy = manager.is_actor_healthy(i)
        in_flight = manager._remote_actor_states[i].get_num_in_flight_requests() if healthy else 0
        states.append(f"{_name(i, actors)}: " + (f"in service, {in_flight} call(s) in flight" if healthy else "out of service"))
    return "; ".join(states)


def _failure(actor: Optional[LearnerActor], actor_id: int, cause: BaseException, what: str) -> LearnerFailed:
    who = actor.describe() if actor else f"learner actor {actor_id}"
    log = log_tail(actor.pid) if actor else "(pid unknown: no worker log)"
    return LearnerFailed(
        f"{who} failed during {what}: {type(cause).__name__}: {str(cause)[:2000]}\n"
        f"Its worker log:\n{log}\n"
        "Learners are not restarted (their optimizer state and process group cannot be rebuilt "
        "mid-run): the run stops here. Continue from the last checkpoint "
        "(Algorithm.from_checkpoint, or rllib train --resume)."
    )
