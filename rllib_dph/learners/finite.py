"""Skipping non-finite optimizer steps on all learners together (a learner base class)."""

from __future__ import annotations

from typing import Any, Dict

import torch
import torch.distributed as dist
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.typing import ParamDict

from rllib_dph.learners.collectives import all_reduce
from rllib_dph.learners.sharding import local

# Metric keys under ``learners/<module_id>/``.
SKIPPED_UPDATES = "skipped_updates"
#: Non-finite optimizer steps skipped in a row so far (the algorithm stops after too many).
CONSECUTIVE_SKIPPED_UPDATES = "consecutive_skipped_updates"


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
