"""FSDP2 sharded learners: parameters, gradients and optimizer state split over the Ray learners.

RLlib (2.60) replicates the module on every learner and wraps it in DDP
(``TorchLearner._make_modules_ddp_if_necessary``); there is no FSDP. With fp32 master weights
and Adam that is 16 bytes per parameter on every learner (128 GB for an 8B model), so no paper
size model fits on an 80 GB GPU. ``sharding="fsdp2"`` shards instead, with PyTorch's FSDP2
(``torch.distributed.fsdp.fully_shard``):

- every decoder layer is its own FSDP unit (all-gathered just before its forward and backward,
  freed after), and the :class:`~rllib_dph.policy.rl_module.ResponseLM` around the whole model is the
  root unit (embeddings, final norm and the LM head, tied or not);
- parameters, gradients and Adam state are float32 shards (1/N each); with
  ``dtype="bfloat16"`` layers compute in bf16 (``MixedPrecisionPolicy(param_dtype=bf16)``)
  and gradients are reduce-scattered in fp32 (``reduce_dtype=float32``);
- full states (checkpoints and the weight sync to the rollout engines,
  ``rllib_dph.policy.full_state``) are gathered tensor by tensor into rank 0's host memory
  (``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True, cpu_offload=True``):
  the accelerator holds at most one full tensor beyond its shards, every other learner keeps
  nothing. Gathering is a collective, so :class:`ShardedLearnerGroup` asks every learner for
  its state where RLlib asks only the first.

Every learner must run the same number of forward passes per step (each one all-gathers), so
the learner pads the micro-batches and the recompute-anchor chunks of a learner with fewer
rows up to the largest count (:meth:`ShardedModules.same_count_on_all_learners`).
"""

from __future__ import annotations

from typing import Any, Dict

import torch
import torch.distributed as dist
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.torch_utils import convert_to_torch_tensor
from ray.rllib.utils.typing import StateDict
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rllib_dph.learners.collectives import all_reduce
from rllib_dph.learners.remote_calls import BoundedLearnerGroup
from rllib_dph.policy.full_state import GATHER, SCATTER

#: ``sharding`` choices: DDP replicas (RLlib's default) or FSDP2 shards.
SHARDINGS = ("ddp", "fsdp2")


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This learner's shard of a ``DTensor``; a plain tensor unchanged."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def shard_response_lm(response_lm: torch.nn.Module, *, device: torch.device, compute_dtype: torch.dtype) -> None:
    """Applies FSDP2 in place: one unit per decoder layer, the ``ResponseLM`` as the root.

    Args:
        response_lm: A :class:`~rllib_dph.policy.rl_module.ResponseLM` (its ``lm`` is a HF causal LM
            whose decoder layers are ``lm.get_decoder().layers``).
        device: The learner's device; the mesh spans all learners of the process group.
        compute_dtype: bf16 gathers bf16 copies of the fp32 shards for the forward and
            backward and reduces gradients in fp32; fp32 computes in fp32.
    """
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in response_lm.lm.get_decoder().layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(response_lm, mesh=mesh, mp_policy=policy)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> StateDict:
    """The optimizer's full state on rank 0, keyed by parameter names; {} elsewhere. Collective."""
    return get_optimizer_state_dict(model, optimizer, options=GATHER)


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: StateDict) -> None:
    """Loads a :func:`full_optimizer_state` into a sharded model's optimizer, or torch's own
    ``optimizer.state_dict()`` of an unsharded learner (e.g. a 1-learner checkpoint)."""
    set_optimizer_state_dict(model, optimizer, optim_state_dict=named_optimizer_state(model, optimizer, state), options=SCATTER)


def named_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: StateDict) -> StateDict:
    """``state`` keyed by parameter names, as :func:`full_optimizer_state` is.

    torch's own ``optimizer.state_dict()`` (what RLlib's unsharded learners checkpoint) numbers
    the parameters by their position in ``optimizer.param_groups``; a state already keyed by
    names is returned unchanged. Both learners build the optimizer from the same parameters in
    the same order (``LLMTorchLearner.get_parameters``), so position i is the same parameter.
    """
    saved = [p for group in state["param_groups"] for p in group["params"]]
    if all(isinstance(p, str) for p in saved):
        return state
    names = {id(param): name for name, param in model.named_parameters()}
    own = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    if len(saved) != len(own):
        raise ValueError(
            f"the optimizer state holds {len(saved)} parameters and this learner's optimizer {len(own)}: "
            "restore a checkpoint of the same model and trainable parameters (lora settings)."
        )
    name_of = dict(zip(saved, own))
    return {
        "state": {name_of[k]: v for k, v in state["state"].items()},
        "param_groups": [{**group, "params": [name_of[p] for p in group["params"]]} for group in state["param_groups"]],
    }


class ShardedLearnerGroup(BoundedLearnerGroup):
    """A learner group whose full state is gathered from the shards of all its learners.

    RLlib's ``LearnerGroup.get_state`` (used by checkpoints and by ``sync_weights``) asks only
    the first learner; with FSDP2 that learner alone would wait forever in the gather. Here every
    learner runs ``get_state`` (the gather is a collective; ``remote_calls.read_learner_state``)
    and the first learner's result, which holds the full tensors, is returned. Restoring needs no
    change: RLlib's ``set_state`` and ``restore_from_path`` already reach every learner, and each
    keeps its shard.
    """

    gathers_state_from_all = True


class ShardedModules(TorchLearner):
    """``sharding="fsdp2"``: the policy (and π_ref) sharded over the learners with FSDP2
    (``rllib_dph.learners.sharding``) instead of RLlib's DDP replicas (``sharding="ddp"``, default).

    Every learner then runs the same number of forward passes per step (each all-gathers; see
    :meth:`same_count_on_all_learners`), and full optimizer states are gathered from all learners.
    """

    @property
    def sharded(self) -> bool:
        """Whether this learner's modules are FSDP2 shards (``sharding="fsdp2"``)."""
        return self.config.sharding == "fsdp2"

    @property
    def _compute_dtype(self) -> torch.dtype:
        from rllib_dph.models.folders import as_dtype

        return as_dtype(self.config.dtype)

    @override(TorchLearner)
    def _make_module(self):
        """RLlib's module on this learner's device; with ``sharding="fsdp2"`` sharded in place
        here, before ``configure_optimizers`` builds Adam, so the optimizer holds shards."""
        # Private RLlib hook: the last point between building the module and its optimizer.
        module = super()._make_module()
        if self.sharded:
            for module_id in module.keys():
                shard_response_lm(module[module_id].response_lm, device=self._device, compute_dtype=self._compute_dtype)
        return module

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        """RLlib wraps every module in DDP when ``num_learners > 1``. An FSDP2-sharded module
        already reduce-scatters its gradients in the backward pass, so it stays unwrapped."""
        # Private RLlib hook: the only place RLlib wraps modules in DDP.
        if not self.sharded:
            super()._make_modules_ddp_if_necessary()

    @override(TorchLearner)
    def _get_optimizer_state(self) -> Dict[str, Any]:
        """RLlib's optimizer state; sharded: each optimizer's full state gathered into rank 0's
        host memory, keyed by parameter names ({} on the other learners; a collective)."""
        # Private RLlib hook: RLlib's own version reads this learner's shards as if whole.
        if not self.sharded:
            return super()._get_optimizer_state()
        return {
            name: {
                "module_id": self._optimizer_name_to_module[name],
                "state": convert_to_numpy(full_optimizer_state(self.module[self._optimizer_name_to_module[name]].model, optim)),
            }
            for name, optim in self._named_optimizers.items()
        }

    @override(TorchLearner)
    def _set_optimizer_state(self, state: Dict[str, Any]) -> None:
        """Loads :meth:`_get_optimizer_state`; sharded: every learner keeps its shard."""
        # Private RLlib hook: the counterpart of `_get_optimizer_state`.
        if not self.sharded:
            return super()._set_optimizer_state(state)
        for name, entry in state.items():
            full = entry["state"]
            full = {**full, "state": convert_to_torch_tensor(full["state"])}
            load_full_optimizer_state(self.module[entry["module_id"]].model, self._named_optimizers[name], full)

    @staticmethod
    @override(TorchLearner)
    def _get_clip_function():
        """RLlib's ``clip_gradients``, whose global norm of sharded gradients is a replicated
        ``DTensor``: returned as a plain tensor (the full norm) for the metrics."""
        # Private RLlib hook: the only way to change the gradient clipping of `postprocess_gradients`.
        from ray.rllib.utils.torch_utils import clip_gradients

        def clip(gradients_dict, **kwargs):
            norm = clip_gradients(gradients_dict, **kwargs)
            return None if norm is None else local(norm)

        return clip

    def same_count_on_all_learners(self, count: int) -> int:
        """The largest ``count`` over the learners when sharded (each forward pass all-gathers,
        so every learner must run as many); ``count`` itself otherwise."""
        if not self.sharded:
            return count
        return int(all_reduce(torch.tensor(count, device=self._device), op=dist.ReduceOp.MAX).item())


def held_bytes(learner) -> Dict[str, int]:
    """Bytes one learner holds in its policy's parameters, gradients and optimizer state.

    Counts this learner's own tensors (its shards under FSDP2); the frozen reference model and
    activations are not included. Used by ``bench/memory.py`` and the sharding tests.
    """
    params = [p for module_id in learner.module.keys() for p in learner.module[module_id].parameters()]
    optimizer = [
        value
        for opt in learner._named_optimizers.values()
        for per_param in opt.state.values()
        for value in per_param.values()
        if torch.is_tensor(value) and value.dim() > 0  # not Adam's scalar step counters
    ]
    size = lambda tensors: sum(local(t).numel() * t.element_size() for t in tensors)  # noqa: E731
    return {
        "parameters": size(params),
        "gradients": size([p.grad for p in params if p.grad is not None]),
        "optimizer": size(optimizer),
    }
