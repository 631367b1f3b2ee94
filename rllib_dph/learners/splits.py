"""How a rollout batch is split for the learners: shards of whole groups, the mini-batches of an
epoch, token-budget micro-batches, padding rows, and trimming the padding of a part.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from rllib_dph import columns as C
from rllib_dph.rollout.batch import TOKEN_COLUMNS, TOPK_COLUMNS, select_rows


def group_units(group_ids: np.ndarray, row_type: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The rows an update must keep together, and the rows it spreads out.

    Args:
        group_ids: (B,) group of each row (``GROUP_IDS``).
        row_type: (B,) ``ROW_TYPE`` of each row.

    Returns:
        (groups, pef): the row indices of each exploration group, in order of first appearance
        (the rows of one prompt's completions), and the indices of the D_pef rows.
    """
    exp = np.flatnonzero(row_type != C.ROW_TYPE_PEF)  # (E,)
    _, first, inverse = np.unique(group_ids[exp], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # groups in order of first appearance
    groups = [exp[inverse == g] for g in order]
    return groups, np.flatnonzero(row_type == C.ROW_TYPE_PEF)


def num_minibatches(rows: int, minibatch_size: Optional[int]) -> int:
    """Optimizer steps per epoch for ``rows`` exploration rows: ⌈rows / minibatch_size⌉, 1 for None."""
    return 1 if minibatch_size is None else max(1, math.ceil(rows / minibatch_size))


def minibatch_plan(
    group_ids: np.ndarray,
    row_type: np.ndarray,
    num_minibatches: int,
    rng: np.random.Generator | None = None,
) -> list[np.ndarray]:
    """Row indices of each mini-batch of one epoch: whole groups, and D_pef rows in every one.

    The exploration groups (shuffled by ``rng``; None keeps their order) are dealt into
    ``num_minibatches`` consecutive bins of ⌊G/M⌋ or ⌈G/M⌉ groups, so the rows of one GRPO
    group are never split. The D_pef rows (shuffled likewise) are dealt the same way, so
    each mini-batch carries ⌊P/M⌋ or ⌈P/M⌉ of them: its share of 1/(ratio + 1) within a
    row. (RLlib's own mini-batching cuts rows in order and shuffles only when
    ``num_epochs > 1``, which put every appended D_pef row into the last mini-batch.)

    Args:
        group_ids: (B,) group of each row.
        row_type: (B,) ``ROW_TYPE`` of each row.
        num_minibatches: M >= 1 optimizer steps per epoch.
        rng: Shuffles groups and D_pef rows (a new order per call: per epoch).

    Returns:
        M arrays of row indices; an array is empty when there are fewer groups and D_pef rows
        than mini-batches.
    """
    if num_minibatches < 1:
        raise ValueError(f"num_minibatches={num_minibatches} must be >= 1.")
    groups, pef = group_units(np.asarray(group_ids), np.asarray(row_type))
    if rng is not None:
        groups = [groups[i] for i in rng.permutation(len(groups))]
        pef = rng.permutation(pef)
    group_bins = np.array_split(np.arange(len(groups)), num_minibatches)
    return [
        np.concatenate([groups[g] for g in bin_groups] + [pef_rows]).astype(np.int64)
        for bin_groups, pef_rows in zip(group_bins, deal_pef_rows(pef, num_minibatches))
    ]


def deal_pef_rows(pef: np.ndarray, num_minibatches: int) -> list[np.ndarray]:
    """The D_pef rows of each of one epoch's ``num_minibatches`` mini-batches: ``pef`` (row
    indices, in the order to deal them) in consecutive bins of ⌊P/M⌋ or ⌈P/M⌉ rows."""
    return np.array_split(pef, num_minibatches)


def shard_groups(batch: dict[str, np.ndarray], num_shards: int) -> list[dict[str, np.ndarray]]:
    """Splits a batch over learners by whole groups: ⌊G/N⌋ or ⌈G/N⌉ groups per shard.

    A shard that would get no group (fewer groups than learners, e.g. after dynamic sampling)
    gets one :func:`padding_row` instead, so every learner takes part in every collective.
    """
    groups, _ = group_units(batch[C.GROUP_IDS], batch[C.ROW_TYPE])
    shards = []
    for bin_groups in np.array_split(np.arange(len(groups)), num_shards):
        rows = np.concatenate([groups[g] for g in bin_groups]).astype(np.int64) if len(bin_groups) else None
        shards.append(padding_row(batch) if rows is None else select_rows(batch, rows))
    return shards


def padding_row(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row of ``batch`` with no response token (``RESPONSE_MASK`` 0) and advantage 0.

    It adds nothing to any loss term, token count or sequence count, and keeps the forward
    pass and the gradient all-reduce of a learner (or mini-batch) without rows working.
    """
    row = {k: v[:1] for k, v in batch.items()}  # numpy arrays or torch tensors alike
    row[C.RESPONSE_MASK] = row[C.RESPONSE_MASK] * 0
    row[C.ADVANTAGES] = row[C.ADVANTAGES] * 0
    row[C.ROW_TYPE] = row[C.ROW_TYPE] * 0 + C.ROW_TYPE_EXP
    return row


def trim_padding(batch: dict) -> dict:
    """The per-token columns cut to the longest row's length (numpy arrays or torch tensors).

    Rows of a mini-batch are right-padded to the longest row of the whole rollout batch; after
    a mini-batch or micro-batch is selected, the columns past its own longest row hold only
    padding, which the forward pass would still pay for.
    """
    width = int(batch[C.ATTENTION_MASK].sum(-1).max())
    return {k: v[:, :width] if k in TOKEN_COLUMNS or k in TOPK_COLUMNS else v for k, v in batch.items()}


def token_budget_microbatches(
    lengths: np.ndarray, max_tokens: int, units: Optional[np.ndarray] = None
) -> list[np.ndarray]:
    """Rows grouped into micro-batches of at most ``max_tokens`` padded tokens each.

    Packing units (by default, single rows; with ``units``, the rows that share a unit id, e.g.
    a GRPO group, so that the learner's forward still runs their shared prompt once) are sorted
    by their longest row (longest first) and packed greedily, so rows of similar length share a
    micro-batch and little padding is computed. A micro-batch holds ``rows × its longest row``
    tokens ≤ ``max_tokens``; a unit over the budget is split into its rows, and a single row
    over the budget gets a micro-batch of its own.

    Args:
        lengths: (B,) tokens of each row (prompt + response).
        max_tokens: The budget, >= 1.
        units: (B,) packing-unit id of each row; None packs rows one by one.

    Returns:
        Arrays of row indices, together covering every row once.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1.")
    lengths = np.asarray(lengths)
    units = np.arange(len(lengths)) if units is None else np.asarray(units)
    _, first, inverse = np.unique(units, return_index=True, return_inverse=True)
    rows_of = []
    for unit in np.argsort(first, kind="stable"):  # units in order of first appearance
        rows = np.flatnonzero(inverse == unit)
        fits = len(rows) * lengths[rows].max() <= max_tokens
        rows_of += [rows] if fits else [rows[i : i + 1] for i in range(len(rows))]
    rows_of.sort(key=lambda rows: -int(lengths[rows].max()))  # stable: equal widths keep their order
    batches, current, width = [], [], 0
    for rows in rows_of:
        width_with = max(width, int(lengths[rows].max()))
        if current and width_with * (len(current) + len(rows)) > max_tokens:
            batches.append(np.array(current, dtype=np.int64))
            current, width_with = [], int(lengths[rows].max())
        current.extend(int(r) for r in rows)
        width = width_with
    if current:
        batches.append(np.array(current, dtype=np.int64))
    return batches
