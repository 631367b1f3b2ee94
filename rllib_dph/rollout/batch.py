"""Rows of a rollout batch (plain numpy, see ``columns`` for the layout): laid out from prompts
and responses, joined and selected.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rllib_dph import columns as C

#: Per-token columns (B, L) and their padding values.
TOKEN_COLUMNS = {
    C.INPUT_IDS: 0,
    C.ATTENTION_MASK: 0,
    C.RESPONSE_MASK: 0,
    C.BEHAVIOR_LOGP: 0.0,
    C.REF_LOGP: 0.0,
    C.ANCHOR_LOGP: 0.0,
}
#: Per-token top-K columns (B, L, K).
TOPK_COLUMNS = {C.TOPK_IDS: 0, C.TOPK_BEHAVIOR_LOGP: 0.0, C.TOPK_ANCHOR_LOGP: 0.0}


def sequence_rows(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    response_logp: Sequence[Sequence[float]] | None = None,
    *,
    logp_column: str = C.BEHAVIOR_LOGP,
    topk_ids: Sequence[np.ndarray] | None = None,
    topk_logp: Sequence[np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Lays out ``prompt + response`` rows right-padded to the longest one.

    Response tokens with a NaN log-prob (a multi-turn episode's env observations, which the
    policy did not sample) get ``RESPONSE_MASK`` 0 (a hole) and 0.0 in the log-prob columns.

    Args:
        prompts: B prompt token-id lists.
        responses: B response token-id lists (EOS included when produced).
        response_logp: B lists of per-response-token log-probs, stored in ``logp_column``
            at the response positions (the behaviour μ for rollouts, π_ref for D_pef rows);
            NaN on tokens the policy did not sample.
        logp_column: Column the log-probs go to.
        topk_ids, topk_logp: B arrays of shape (T_i, K) with the engine's top-K per response token.

    Returns:
        Per-token columns (B, L) (and (B, L, K) for top-K) plus ``PROMPT_LENGTH`` and
        ``RESPONSE_LENGTH`` (B,).
    """
    n = len(prompts)
    if len(responses) != n:
        raise ValueError(f"got {n} prompts but {len(responses)} responses; give one response per row.")
    p_len = np.array([len(p) for p in prompts], dtype=np.int64)
    r_len = np.array([len(r) for r in responses], dtype=np.int64)
    length = int((p_len + r_len).max(initial=1))
    out = {
        C.INPUT_IDS: np.zeros((n, length), dtype=np.int64),
        C.ATTENTION_MASK: np.zeros((n, length), dtype=np.int64),
        C.RESPONSE_MASK: np.zeros((n, length), dtype=np.int64),
        C.PROMPT_LENGTH: p_len,
        C.RESPONSE_LENGTH: r_len,
    }
    if response_logp is not None:
        out[logp_column] = np.zeros((n, length), dtype=np.float32)
    if topk_ids is not None:
        k = topk_ids[0].shape[1]
        out[C.TOPK_IDS] = np.zeros((n, length, k), dtype=np.int64)
        out[C.TOPK_BEHAVIOR_LOGP] = np.zeros((n, length, k), dtype=np.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        a, b = p_len[i], p_len[i] + r_len[i]
        out[C.INPUT_IDS][i, :a] = p
        out[C.INPUT_IDS][i, a:b] = r
        out[C.ATTENTION_MASK][i, :b] = 1
        out[C.RESPONSE_MASK][i, a:b] = 1
        if response_logp is not None:
            logp = np.asarray(response_logp[i], dtype=np.float32)  # (T_i,) NaN on observations
            out[C.RESPONSE_MASK][i, a:b] = ~np.isnan(logp)
            out[logp_column][i, a:b] = np.where(np.isnan(logp), 0.0, logp)
        if topk_ids is not None:
            out[C.TOPK_IDS][i, a:b] = topk_ids[i]
            out[C.TOPK_BEHAVIOR_LOGP][i, a:b] = np.where(np.isnan(topk_logp[i]), 0.0, topk_logp[i])
    return out


def concat_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenates batches row-wise, right-padding per-token columns to the longest length.

    Columns present in only some batches are filled with their padding value in the others
    (e.g. ``REF_LOGP`` exists only on D_pef rows), so mixed batches keep one layout.
    """
    batches = [b for b in batches if len(b[C.INPUT_IDS])]
    if not batches:
        raise ValueError("concat_batches got no rows; sample at least one batch first.")
    length = max(b[C.INPUT_IDS].shape[1] for b in batches)
    keys = set().union(*batches)
    out = {}
    for key in keys:
        parts = []
        for b in batches:
            rows = len(b[C.INPUT_IDS])
            if key in b:
                value = b[key]
            elif key in TOKEN_COLUMNS or key in TOPK_COLUMNS:
                template = next(x[key] for x in batches if key in x)
                value = np.zeros((rows,) + template.shape[1:], dtype=template.dtype)
            else:
                raise ValueError(
                    f"column {key!r} is missing from a batch of {rows} rows; per-row columns "
                    "must be present in every batch."
                )
            if key in TOKEN_COLUMNS or key in TOPK_COLUMNS:
                pad = [(0, 0), (0, length - value.shape[1])] + [(0, 0)] * (value.ndim - 2)
                value = np.pad(value, pad)
            parts.append(value)
        out[key] = np.concatenate(parts, axis=0)
    return out


def select_rows(batch: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The rows ``rows`` (indices or a boolean mask) of every column."""
    return {k: v[rows] for k, v in batch.items()}
