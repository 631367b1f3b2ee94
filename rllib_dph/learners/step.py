"""One optimizer step's shared state: the whole step's aggregation denominators and the metrics of
its loss calls, handed to each loss call in its batch (``STEP``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

import torch
import torch.distributed as dist

from rllib_dph import columns as C
from rllib_dph.learners.splits import padding_row, trim_padding
from rllib_dph.learners.collectives import all_reduce, distributed
from rllib_dph.losses.tokens import AGGREGATIONS, aggregate_parts


def row_mask(batch: Dict[str, Any], row_type: int) -> torch.Tensor:
    """(B, L) bool: response tokens of the rows of ``row_type`` (``columns.ROW_TYPE_*``)."""
    return batch[C.RESPONSE_MASK].bool() & (batch[C.ROW_TYPE] == row_type)[:, None]


def take_rows(columns: Dict[str, Any], rows, device) -> Dict[str, Any]:
    """Rows ``rows`` of a tensor batch cut to their longest row; with no rows, one padding row
    (``splits.padding_row``), which keeps this learner in the step's collectives."""
    if not len(rows):
        return padding_row(columns)
    return trim_padding({k: v[torch.as_tensor(rows, device=device)] for k, v in columns.items()})


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
    world = dist.get_world_size() if distributed() else 1
    return Step(dict(zip(keys, all_reduce(torch.stack(dens)))), norm_length=norm_length, world=world)
