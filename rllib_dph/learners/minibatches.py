"""Mini-batches of whole GRPO groups with D_pef rows in each (a learner base class)."""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import torch.distributed as dist
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from rllib_dph import columns as C
from rllib_dph.learners.splits import minibatch_plan
from rllib_dph.learners.splits import num_minibatches as num_minibatches_for
from rllib_dph.learners.collectives import distributed
from rllib_dph.learners.step import take_rows

# Metric keys under ``learners/<module_id>/``: D_pef rows in the mini-batches of an update.
PEF_ROWS_MIN = "pef_rows_min"
PEF_ROWS_MAX = "pef_rows_max"


class GroupMinibatches(TorchLearner):
    """Mini-batches of whole GRPO groups with D_pef rows in each (RLlib cuts rows in order).

    Each epoch deals whole groups into ``num_minibatches`` mini-batches and spreads the D_pef
    rows of DPH over all of them (``splits.minibatch_plan``; ``splits.deal_pef_rows`` deals the
    D_pef rows); when the batch has D_pef rows, the smallest and largest number of them in a
    mini-batch are logged per update (``pef_rows_min``, ``pef_rows_max``).
    """

    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        self._rank = dist.get_rank() if distributed() else 0

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
        ``shuffle_batch_per_epoch`` is set and there is more than one mini-batch, by
        ``default_rng([seed, rank, update count])``: the update count (RLlib's weights sequence
        number) is in every learner checkpoint, so a resumed run shuffles as the uninterrupted one.
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
        rng = np.random.default_rng([self.config.seed or 0, self._rank, self._weights_seq_no]) if shuffle else None
        return self._minibatches(module_id, dict(columns), group_ids, row_type, num_epochs, num_minibatches, rng)

    def _minibatches(self, module_id, columns, group_ids, row_type, num_epochs, num_minibatches, rng):
        """Yields every epoch's mini-batches (shuffled by ``rng``; None keeps the order), then
        logs how many D_pef rows they held."""
        pef_rows = []  # D_pef rows in each mini-batch
        for _ in range(num_epochs):
            plan = minibatch_plan(group_ids, row_type, num_minibatches, rng)
            for rows in plan:
                pef_rows.append(int((row_type[rows] == C.ROW_TYPE_PEF).sum()))
                part = take_rows(columns, rows, self._device)
                yield MultiAgentBatch({module_id: SampleBatch(part)}, env_steps=len(rows))
        if (row_type == C.ROW_TYPE_PEF).any():
            seen = pef_rows or [0]
            self.metrics.log_dict({PEF_ROWS_MIN: min(seen), PEF_ROWS_MAX: max(seen)}, key=module_id, window=1)
