"""The optimizer step on a mini-batch, in one pass or over token-budget micro-batches (a learner base class)."""

from __future__ import annotations

import contextlib
from typing import Any, Dict

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from rllib_dph import columns as C
from rllib_dph.learners.splits import token_budget_microbatches
from rllib_dph.learners.collectives import distributed
from rllib_dph.learners.step import STEP, open_step, take_rows

# Metric key under ``learners/<module_id>/``: micro-batches of the last step.
NUM_MICROBATCHES = "num_microbatches"


class TokenBudgetSteps(TorchLearner):
    """One optimizer step per mini-batch: in one pass, or accumulated over micro-batches of at
    most ``max_tokens_per_microbatch`` padded tokens (gradient accumulation).

    The step's ``Step`` (``open_step``: the whole mini-batch's denominators) reaches every loss
    call in its batch under ``STEP``, so the loss is the whole mini-batch's either way. DDP
    reduces the gradients once, at the last micro-batch's backward (``no_sync`` before). The
    losses go to ``apply_gradients(..., losses=)`` (``finite.SkipNonFiniteSteps``); a sharded
    learner pads its micro-batches to the largest count (``same_count_on_all_learners`` of
    ``sharding.ShardedModules``). With micro-batches, loss parts and token counts are logged
    summed over them, ``*_max`` maxed, the other metrics averaged.
    """

    @override(TorchLearner)
    def _uncompiled_update(self, batch: Dict[str, Any], **kwargs):
        # Private RLlib hook: the one place a mini-batch becomes forward, backward and optimizer step.
        (module_id, columns), = batch.items()
        step = open_step(columns, norm_length=self.config.max_response_length)
        budget = self.config.max_tokens_per_microbatch
        plan = None if budget is None else self._microbatch_plan(columns, budget)
        parts = [columns] if plan is None else (take_rows(columns, rows, self._device) for rows in plan)
        count = 1 if plan is None else len(plan)
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        module, losses = self.module[module_id], []
        for i, part in enumerate(parts):
            last = i == count - 1
            with contextlib.nullcontext() if last or not distributed() else module.no_sync():
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

    def _microbatch_plan(self, columns: Dict[str, Any], max_tokens: int) -> list[np.ndarray]:
        """Row indices of each micro-batch, then no rows (a padding row) for each micro-batch
        another learner has more (sharded). A GRPO group stays in one micro-batch when it fits,
        so its prompt is still run once."""
        lengths = columns[C.ATTENTION_MASK].sum(-1).cpu().numpy()
        pef = columns[C.ROW_TYPE].cpu().numpy() == C.ROW_TYPE_PEF
        units = np.where(pef, -1 - np.arange(len(lengths)), columns[C.GROUP_IDS].cpu().numpy())
        plan = token_budget_microbatches(lengths, max_tokens, units)
        return plan + [np.empty(0, np.int64)] * (self.same_count_on_all_learners(len(plan)) - len(plan))


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
