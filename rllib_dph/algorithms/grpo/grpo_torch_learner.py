"""Torch learner of GRPO: assembles the loss terms of ``rllib_dph.losses`` and logs each one."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.torch_utils import convert_to_torch_tensor
from ray.rllib.utils.typing import ModuleID, ParamDict, TensorType

from rllib_dph import columns as C
from rllib_dph.batch import minibatch_plan, padding_row, token_budget_microbatches, trim_padding
from rllib_dph.batch import num_minibatches as num_minibatches_for
from rllib_dph.losses import (
    AGGREGATIONS,
    aggregate_parts,
    bad_update_fraction,
    dual_clip_mask,
    kl_estimate,
    masked_mean,
    policy_gradient_loss,
    token_logprobs,
    trust_region_mask,
)
from rllib_dph.rl_module import ENTROPY, LOGP, TOPK_LOGP, ResponseLM, autocast, scatter_tokens
from rllib_dph.sharding import (
    full_optimizer_state,
    load_full_optimizer_state,
    local,
    shard_response_lm,
)

# Metric keys under ``learners/<module_id>/``.
POLICY_LOSS = "policy_loss"
KL_LOSS = "kl_loss"
ENTROPY_MEAN = "entropy"
TOTAL_LOSS = "total_loss"
CLIP_FRACTION = "clip_fraction"
CLIP_FRACTION_POS = "clip_fraction_pos_adv"
CLIP_FRACTION_NEG = "clip_fraction_neg_adv"
PROB_DIFF_MEAN = "abs_prob_diff_mean"
PROB_DIFF_MAX = "abs_prob_diff_max"
TRUST_REGION_DIVERGENCE = "trust_region_divergence_mean"
BAD_UPDATE_FRACTION = "bad_update_fraction"
APPROX_KL = "approx_kl_to_behavior"
NUM_EXP_TOKENS = "num_exploration_tokens"
DUAL_CLIP_FRACTION = "dual_clip_fraction"
SKIPPED_UPDATES = "skipped_updates"
#: Non-finite optimizer steps skipped in a row so far (the algorithm stops after too many).
CONSECUTIVE_SKIPPED_UPDATES = "consecutive_skipped_updates"
NUM_MICROBATCHES = "num_microbatches"
PEF_ROWS_MIN = "pef_rows_min"
PEF_ROWS_MAX = "pef_rows_max"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``tensor`` reduced over all learners (in place), unchanged with a single learner."""
    if _distributed():
        dist.all_reduce(tensor, op=op)
    return tensor


def row_mask(batch: Dict[str, Any], row_type: int) -> torch.Tensor:
    """(B, L) bool: response tokens of the rows of ``row_type`` (``columns.ROW_TYPE_*``)."""
    return batch[C.RESPONSE_MASK].bool() & (batch[C.ROW_TYPE] == row_type)[:, None]


#: Batch key under which each loss call of an optimizer step finds the step's :class:`Step`.
STEP = "rllib_dph_step"


@dataclass
class Step:
    """What the loss calls of one optimizer step share; handed to each in its batch (``STEP``).

    Attributes:
        denominators: (row type, aggregation mode) → that aggregation's denominator over the
            whole step: response tokens ("token-mean") or rows with tokens (the seq-mean modes),
            summed over all learners (:func:`open_step`).
        norm_length: N of "seq-mean-token-sum-norm" (the maximum response length).
        world: The number of learners.
        metrics: The detached metrics of each loss call of the step (one per micro-batch).
    """

    denominators: Dict[tuple, torch.Tensor]
    norm_length: float
    world: int = 1
    metrics: list = field(default_factory=list)

    def aggregate(self, values: torch.Tensor, mask: torch.Tensor, *, row_type: int, mode: str = "token-mean"):
        """``masked_aggregate`` over the whole step across all learners and micro-batches.

        The numerator is this (micro-)batch's; the denominator is the whole step's. Each learner
        returns numerator / global denominator × N, which DDP's gradient averaging and gradient
        accumulation turn into the gradient of Σ numerators / global denominator.
        """
        num, _ = aggregate_parts(values, mask, mode=mode, norm_length=self.norm_length)
        return num / self.denominators[(row_type, mode)].clamp_min(1) * self.world

    def rows(self, row_type: int) -> float:
        """Rows of ``row_type`` with response tokens in the whole step (all learners)."""
        return self.denominators[(row_type, "seq-mean-token-mean")].item()


def open_step(batch: Dict[str, Any], *, norm_length: float) -> Step:
    """The :class:`Step` of one optimizer step on ``batch`` (this learner's whole mini-batch);
    its denominators are summed over all learners in one all-reduce (a collective)."""
    keys, dens = [], []
    for row_type in (C.ROW_TYPE_EXP, C.ROW_TYPE_PEF):
        mask = row_mask(batch, row_type)  # (B, L)
        for mode in AGGREGATIONS:
            keys.append((row_type, mode))
            dens.append(aggregate_parts(torch.zeros(mask.shape, device=mask.device), mask, mode=mode)[1])
    world = dist.get_world_size() if _distributed() else 1
    return Step(dict(zip(keys, all_reduce(torch.stack(dens)))), norm_length=norm_length, world=world)


class ShardedModules(TorchLearner):
    """``sharding="fsdp2"``: the policy (and π_ref) sharded over the learners with FSDP2
    (``rllib_dph.sharding``) instead of RLlib's DDP replicas (``sharding="ddp"``, default).

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


class GroupMinibatches(TorchLearner):
    """Mini-batches of whole GRPO groups with D_pef rows in each (RLlib cuts rows in order).

    Each epoch deals whole groups into ``num_minibatches`` mini-batches and spreads the D_pef
    rows of DPH over all of them (``batch.minibatch_plan``); when the batch has D_pef rows, the
    smallest and largest number of them in a mini-batch are logged per update
    (``pef_rows_min``, ``pef_rows_max``).
    """

    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        rank = dist.get_rank() if _distributed() else 0
        self._plan_rng = np.random.default_rng([self.config.seed or 0, rank])  # mini-batch shuffles

    @override(TorchLearner)
    def _create_iterator_if_necessary(
        self,
        *,
        training_data: TrainingData,
        num_epochs: int = 1,
        minibatch_size: Optional[int] = None,
        shuffle_batch_per_epoch: bool = False,
        num_minibatches: Optional[int] = None,
        **kwargs,
    ) -> Iterator[MultiAgentBatch]:
        """Mini-batches of whole groups with D_pef rows in each, for ``num_epochs`` epochs.

        ``num_minibatches`` comes from the algorithm (the same on every learner, computed from
        the global ``minibatch_size``); a learner updated on its own derives it from its batch.
        Groups and D_pef rows are reshuffled into new mini-batches every epoch when
        ``shuffle_batch_per_epoch`` is set and there is more than one mini-batch.
        """
        # Private RLlib hook: the only place RLlib cuts an update's batch into mini-batches.
        batch = self._make_batch_if_necessary(training_data=training_data)
        if len(batch.policy_batches) != 1:
            raise ValueError(
                f"GRPO learners train one module, got a batch for {sorted(batch.policy_batches)}."
            )
        (module_id, columns), = batch.policy_batches.items()
        group_ids = columns[C.GROUP_IDS].cpu().numpy()
        row_type = columns[C.ROW_TYPE].cpu().numpy()
        if num_minibatches is None:
            num_minibatches = num_minibatches_for(int((row_type != C.ROW_TYPE_PEF).sum()), minibatch_size)
        shuffle = shuffle_batch_per_epoch and num_minibatches > 1
        return self._minibatches(module_id, dict(columns), group_ids, row_type, num_epochs, num_minibatches, shuffle)

    def _minibatches(self, module_id, columns, group_ids, row_type, num_epochs, num_minibatches, shuffle):
        pef_rows = []  # D_pef rows in each mini-batch
        for _ in range(num_epochs):
            plan = minibatch_plan(group_ids, row_type, num_minibatches, self._plan_rng if shuffle else None)
            for rows in plan:
                pef_rows.append(int((row_type[rows] == C.ROW_TYPE_PEF).sum()))
                if len(rows):
                    index = torch.as_tensor(rows, device=self._device)
                    part = trim_padding({k: v[index] for k, v in columns.items()})
                else:
                    part = padding_row(columns)  # keeps this learner in the step's collectives
                yield MultiAgentBatch({module_id: SampleBatch(part)}, env_steps=len(rows))
        if (row_type == C.ROW_TYPE_PEF).any():
            seen = pef_rows or [0]
            self.metrics.log_dict({PEF_ROWS_MIN: min(seen), PEF_ROWS_MAX: max(seen)}, key=module_id, window=1)


class TokenBudgetSteps(TorchLearner):
    """One optimizer step per mini-batch: in one pass, or accumulated over micro-batches of at
    most ``max_tokens_per_microbatch`` padded tokens (gradient accumulation).

    The step's :class:`Step` (``open_step``: the whole mini-batch's denominators) reaches every
    loss call in its batch under ``STEP``, so the loss is the whole mini-batch's either way. DDP
    reduces the gradients once, at the last micro-batch's backward (``no_sync`` before). The
    losses go to ``apply_gradients(..., losses=)`` (:class:`SkipNonFiniteSteps`); a sharded
    learner pads its micro-batches to the largest count (``same_count_on_all_learners`` of
    :class:`ShardedModules`). With micro-batches, loss parts and token counts are logged summed
    over them, ``*_max`` maxed, the other metrics averaged.
    """

    @override(TorchLearner)
    def _uncompiled_update(self, batch: Dict[str, Any], **kwargs):
        # Private RLlib hook: the one place a mini-batch becomes forward, backward and optimizer step.
        (module_id, columns), = batch.items()
        step = open_step(columns, norm_length=self.config.max_response_length)
        budget = self.config.max_tokens_per_microbatch
        plan = None if budget is None else self._microbatch_plan(columns, budget)
        parts = [columns] if plan is None else (self._microbatch(columns, rows) for rows in plan)
        count = 1 if plan is None else len(plan)
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        module, losses = self.module[module_id], []
        for i, part in enumerate(parts):
            last = i == count - 1
            with contextlib.nullcontext() if last or not _distributed() else module.no_sync():
                fwd_out = self.module.forward_train({module_id: part})
                loss = self.compute_losses(fwd_out=fwd_out, batch={module_id: {**part, STEP: step}})[module_id]
                loss.backward()
            losses.append(loss.detach())
        if step.metrics:
            metrics = step.metrics[0] if plan is None else {**_combine(step.metrics), NUM_MICROBATCHES: count}
            self.metrics.log_dict(metrics, key=module_id, window=1)
        gradients = {pid: p.grad for pid, p in self._params.items()}
        with contextlib.ExitStack() as stack:
            if self.config.num_learners > 1:
                stack.enter_context(module.no_sync())  # as RLlib's own update step does
            self.apply_gradients(self.postprocess_gradients(gradients), losses=losses)
        return fwd_out, {module_id: torch.stack(losses).sum()}, {}

    def _microbatch_plan(self, columns: Dict[str, Any], max_tokens: int) -> list:
        """Row indices of each micro-batch, then None (an empty row) for each micro-batch another
        learner has more (sharded). A GRPO group stays in one micro-batch when it fits, so its
        prompt is still run once."""
        lengths = columns[C.ATTENTION_MASK].sum(-1).cpu().numpy()
        pef = columns[C.ROW_TYPE].cpu().numpy() == C.ROW_TYPE_PEF
        units = np.where(pef, -1 - np.arange(len(lengths)), columns[C.GROUP_IDS].cpu().numpy())
        plan = token_budget_microbatches(lengths, max_tokens, units)
        return plan + [None] * (self.same_count_on_all_learners(len(plan)) - len(plan))

    def _microbatch(self, columns: Dict[str, Any], rows: Optional[np.ndarray]) -> Dict[str, Any]:
        if rows is None:  # another learner has more micro-batches (sharded)
            return padding_row(columns)
        return trim_padding({k: v[torch.as_tensor(rows, device=self._device)] for k, v in columns.items()})


class SkipNonFiniteSteps(TorchLearner):
    """Steps the optimizer only when the loss and every gradient are finite on all learners.

    RLlib's default turns NaN/inf gradients into zeros and steps anyway, which still moves the
    weights (Adam's moments) and corrupts the optimizer state. Here such a step is skipped on
    every learner together (one all-reduce of the verdict: no DDP deadlock), its gradients are
    dropped and it is counted (``skipped_updates`` per update, ``consecutive_skipped_updates``).
    """

    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        self._skipped_this_update = 0
        self._skipped_in_a_row = 0

    @override(TorchLearner)
    def before_gradient_based_update(self, *, timesteps: Dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self._skipped_this_update = 0

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: ParamDict, *, losses: tuple = ()) -> None:
        """RLlib's step unless a loss in ``losses`` (the step's) or a gradient is not finite on
        some learner; then the gradients are dropped and the step counted as skipped."""
        checks = [loss.isfinite().all() for loss in losses]
        checks += [local(g).isfinite().all() for g in gradients_dict.values() if g is not None]
        finite = torch.stack(checks).all() if checks else torch.tensor(True)  # one device sync below
        verdict = all_reduce(finite.float().to(self._device), op=dist.ReduceOp.MIN)
        if verdict.item() < 1:
            for param in self._params.values():
                param.grad = None
            self._skipped_this_update += 1
            self._skipped_in_a_row += 1
            return
        self._skipped_in_a_row = 0
        super().apply_gradients(gradients_dict)

    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps: Dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        counts = {SKIPPED_UPDATES: self._skipped_this_update, CONSECUTIVE_SKIPPED_UPDATES: self._skipped_in_a_row}
        for module_id in self.module.keys():
            self.metrics.log_dict(counts, key=module_id, window=1)


class LLMTorchLearner(ShardedModules, SkipNonFiniteSteps, TokenBudgetSteps, GroupMinibatches):
    """The machinery under the GRPO-family losses (one concern per base class): mini-batches of
    whole groups (:class:`GroupMinibatches`), token-budget steps (:class:`TokenBudgetSteps`),
    non-finite step skipping (:class:`SkipNonFiniteSteps`) and FSDP2 sharding
    (:class:`ShardedModules`); here the inputs the loss terms read besides the batch: the frozen
    reference model π_ref (built only when ``config.needs_reference_model``) and, with
    ``trust_region_anchor="recompute"``, π_old's log-probs recomputed before the update.

    Mixed precision: the policy's parameters and Adam state are float32 and its forward pass
    runs under autocast to ``config.dtype`` (inside ``LLMRLModule._forward_train``, so every
    caller gets it). The frozen reference model is loaded the same way (float32 weights, the
    same autocast), so π_ref computes exactly what the initial π_θ computes and the KL starts at
    0; a bf16 copy would differ by bf16 rounding (on an H100, random-token rows: mean k3 KL
    1e-3 per token at step 0 for tiny-sql-math, 2e-5 for a random-weight 100M Qwen2).
    """

    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        self._ref_lm = None
        if self.config.needs_reference_model:
            from rllib_dph.models.hub import load_causal_lm

            self._ref_lm = ResponseLM(load_causal_lm(self.config.reference_model_name, dtype=torch.float32))
            self._ref_lm.to(self._device).eval().requires_grad_(False)
            if self.sharded:
                shard_response_lm(self._ref_lm, device=self._device, compute_dtype=self._compute_dtype)

    @property
    def ref_model(self):
        """The frozen reference model π_ref (a HF causal LM), or None when no term needs it."""
        return None if self._ref_lm is None else self._ref_lm.lm

    @torch.no_grad()
    def reference_logp(self, batch: Dict[str, Any]) -> torch.Tensor:
        """(B, L) log π_ref of every response token given its prefix, at the sampling temperature."""
        with autocast(self._device, self._compute_dtype):
            logits, where = self._ref_lm.logits(batch)  # (N, V), (B, L-1)
        targets = batch[C.INPUT_IDS][:, 1:][where]  # (N,)
        return scatter_tokens(token_logprobs(logits, targets, temperature=self.config.temperature), where)

    @override(TorchLearner)
    def update(self, *args, training_data: TrainingData = None, batch=None, **kwargs):
        """With ``trust_region_anchor="recompute"``, adds π_old log-probs before the update."""
        if self.config.trust_region_anchor == "recompute":
            training_data = training_data or TrainingData(batch=batch)
            batch = None
            for module_id, module_batch in training_data.batch.policy_batches.items():
                self._add_recomputed_anchor(module_id, module_batch)
        return super().update(*args, training_data=training_data, batch=batch, **kwargs)

    @torch.no_grad()
    def _add_recomputed_anchor(self, module_id, module_batch, chunk: int = 64) -> None:
        """Sets ``ANCHOR_LOGP`` (and ``TOPK_ANCHOR_LOGP``) to the current weights' log-probs."""
        module = self.module[module_id].unwrapped()
        keys = [C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK] + ([C.TOPK_IDS] if C.TOPK_IDS in module_batch else [])
        rows = len(module_batch[C.INPUT_IDS])
        starts = list(range(0, rows, chunk))
        for _ in range(self.same_count_on_all_learners(len(starts)) - len(starts)):
            module._forward_train({k: torch.as_tensor(module_batch[k][:1], device=self._device) for k in keys})
        logps, topks = [], []
        for start in starts:
            part = {k: torch.as_tensor(module_batch[k][start : start + chunk], device=self._device) for k in keys}
            out = module._forward_train(part)
            logps.append(out[LOGP].float().cpu().numpy())
            if TOPK_LOGP in out:
                topks.append(out[TOPK_LOGP].float().cpu().numpy())
        module_batch[C.ANCHOR_LOGP] = np.concatenate(logps)
        if topks:
            module_batch[C.TOPK_ANCHOR_LOGP] = np.concatenate(topks)


class GRPOTorchLearner(LLMTorchLearner):
    """Policy-gradient loss on exploration rows (``ROW_TYPE_EXP``), per token:

        loss = agg( −M_t · sg(min(π_θ/μ, C)) · Â · log π_θ )  +  β · agg( KL_est(π_θ‖π_ref) )
               − c_H · agg( H(π_θ) )

    with M_t the trust-region mask anchored on the rollout policy μ (PPO ratio clipping or a
    DPPO divergence mask), C the importance-weight truncation and agg the configured
    aggregation. Aggregation is global (:meth:`Step.aggregate`): a term's denominator (tokens or
    sequences) is summed over all learners and micro-batches before dividing, so N DDP learners
    take the step one learner would take on the same rows. A frozen reference model is built
    only when ``kl_coeff > 0``. Mini-batches, micro-batches, non-finite steps and sharding:
    :class:`LLMTorchLearner`.
    """

    @override(TorchLearner)
    def compute_loss_for_module(
        self,
        *,
        module_id: ModuleID,
        config,
        batch: Dict[str, Any],
        fwd_out: Dict[str, TensorType],
    ) -> TensorType:
        """The terms assembled; their metrics go to the step (logged by it), or are logged here
        when called outside an update (no ``STEP`` in ``batch``: the batch is its own step)."""
        step = batch[STEP] if STEP in batch else open_step(batch, norm_length=config.max_response_length)
        metrics: Dict[str, Any] = {}
        total = self.policy_loss(config, batch, fwd_out, step, metrics)
        total = total + self.auxiliary_loss(config, batch, fwd_out, step, metrics)
        metrics[TOTAL_LOSS] = total
        metrics = {k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()}
        if STEP in batch:
            step.metrics.append(metrics)
        else:
            self.metrics.log_dict(metrics, key=module_id, window=1)
        return total

    def policy_loss(self, config, batch, fwd_out, step: Step, metrics: Dict[str, Any]) -> torch.Tensor:
        """The trust-region policy-gradient term on exploration rows (DPPO Eq. 23).

        The mask and the importance weight are anchored on ``ANCHOR_LOGP`` when the batch has
        it (the "recompute" ablation), else on the rollout engine's μ (``BEHAVIOR_LOGP``).
        """
        logp = fwd_out[LOGP]  # (B, L)
        behavior_logp = batch[C.BEHAVIOR_LOGP].float()  # (B, L)
        anchor_logp = batch.get(C.ANCHOR_LOGP, batch[C.BEHAVIOR_LOGP]).float()  # (B, L)
        advantages = batch[C.ADVANTAGES].float()[:, None]  # (B, 1)
        valid = row_mask(batch, C.ROW_TYPE_EXP)  # (B, L)
        low, high = config.trust_region_bounds
        topk = dict(
            topk_logp=fwd_out.get(TOPK_LOGP),
            topk_behavior_logp=batch.get(C.TOPK_ANCHOR_LOGP, batch.get(C.TOPK_BEHAVIOR_LOGP)),
        )
        keep, divergence = trust_region_mask(
            logp.detach(), anchor_logp, advantages, kind=config.trust_region, low=low, high=high,
            return_divergence=True, **topk
        )  # (B, L), (B, L) or None
        dual_keep = dual_clip_mask(logp.detach(), anchor_logp, advantages, clip_ratio_c=config.clip_ratio_c)  # (B, L)
        pg = policy_gradient_loss(
            logp, anchor_logp, advantages, keep & dual_keep, truncation=config.is_truncation
        )  # (B, L)
        loss = step.aggregate(pg, valid, row_type=C.ROW_TYPE_EXP, mode=config.loss_agg_mode)
        metrics[POLICY_LOSS] = loss
        metrics[NUM_EXP_TOKENS] = valid.sum().float()
        metrics[DUAL_CLIP_FRACTION] = masked_mean((~dual_keep).float(), valid)
        metrics.update(self._trust_region_metrics(logp.detach(), behavior_logp, advantages, keep, divergence, valid))
        return loss

    def auxiliary_loss(self, config, batch, fwd_out, step: Step, metrics: Dict[str, Any]) -> torch.Tensor:
        """β·KL(π_θ‖π_ref) on exploration rows (when ``kl_coeff > 0``) and the entropy bonus."""
        logp = fwd_out[LOGP]  # (B, L)
        valid = row_mask(batch, C.ROW_TYPE_EXP)  # (B, L)
        loss = logp.new_zeros(())
        if config.kl_coeff > 0:
            kl = kl_estimate(logp, self.reference_logp(batch), kind=config.kl_estimator)  # (B, L)
            kl_loss = step.aggregate(kl, valid, row_type=C.ROW_TYPE_EXP, mode=config.loss_agg_mode)
            loss = loss + config.kl_coeff * kl_loss
            metrics[KL_LOSS] = kl_loss
        metrics[ENTROPY_MEAN] = masked_mean(fwd_out[ENTROPY], valid)
        if config.entropy_coeff:
            entropy = step.aggregate(fwd_out[ENTROPY], valid, row_type=C.ROW_TYPE_EXP, mode=config.loss_agg_mode)
            loss = loss - config.entropy_coeff * entropy
        return loss

    def _trust_region_metrics(self, logp, behavior_logp, advantages, keep, divergence, valid):
        """Masked fractions by advantage sign, the mask's divergence (to the anchor; None for
        a trust region without one), and the train-inference mismatch to the rollout policy μ:
        |π − μ|, KL, bad updates (DPPO §5.3)."""
        adv = advantages.expand_as(logp)  # (B, L)
        dropped = (~keep).float()
        prob_diff = (logp.exp() - behavior_logp.exp()).abs()  # (B, L)
        log_ratio = logp - behavior_logp  # (B, L)
        out = {
            CLIP_FRACTION: masked_mean(dropped, valid),
            CLIP_FRACTION_POS: masked_mean(dropped, valid & (adv > 0)),
            CLIP_FRACTION_NEG: masked_mean(dropped, valid & (adv < 0)),
            PROB_DIFF_MEAN: masked_mean(prob_diff, valid),
            PROB_DIFF_MAX: prob_diff.masked_fill(~valid, 0).max(),
            APPROX_KL: masked_mean(torch.exp(-log_ratio) + log_ratio - 1, valid),
            BAD_UPDATE_FRACTION: bad_update_fraction(logp, behavior_logp, advantages, valid),
        }
        if divergence is not None:
            out[TRUST_REGION_DIVERGENCE] = masked_mean(divergence, valid)
        return out


def _combine(parts: list[Dict[str, Any]]) -> Dict[str, Any]:
    """One step's metrics from its micro-batches': sums of loss parts and token counts, maxima
    of ``*_max``, means of the rest (fractions and means, each over its micro-batch)."""
    combined = {}
    for key in parts[0]:
        values = torch.stack([torch.as_tensor(p[key], dtype=torch.float32) for p in parts])
        if key.endswith("_loss") or key.startswith("num_"):
            combined[key] = values.sum()
        elif key.endswith("_max"):
            combined[key] = values.max()
        else:
            combined[key] = values.mean()
    return combined
