"""The offline-data connector of DPH-RL: D_pef reference rows mixed into every update.

Each learner builds one :class:`AddPefRows` over its own shard of the D_pef file (rows
``rank::num_learners``) and runs it on its share of every train batch, so each learner receives
its own D_pef rows at the configured ratio. The rows carry the stored reference responses and
their log-probs under the initial model (``REF_LOGP``) and are marked ``ROW_TYPE_PEF``: the
loss tells rows apart by this per-row mask, never by routing whole micro-batches. No reference
model is involved.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2

from rllib_dph import columns as C
from rllib_dph.algorithms.dph.presample import read_presampled_table
from rllib_dph.rollout.batch import concat_batches, sequence_rows

PEF_COLUMNS = ("prompt_ids", "response_ids", "ref_logp")


class PefRowSampler:
    """Cycles through one shard of a D_pef file, reshuffling it at every pass.

    Pass ``p`` takes the shard's rows in the order ``default_rng([seed, shard_index, p])``
    permutes them, so the rows taken so far (:attr:`rows_taken`, the sampler's whole state) say
    which rows come next: a learner checkpoint keeps it and a resumed run continues the order.

    Args:
        path: A ``d_pef.parquet`` file of the pre-sampling stage.
        shard_index: This learner's rank.
        num_shards: Number of learners; the shard is rows ``shard_index::num_shards``.
        seed: Seed of the per-pass shuffles.
    """

    def __init__(self, path: str, *, shard_index: int = 0, num_shards: int = 1, seed: int = 0):
        table = read_presampled_table(path)  # checked against its checksum: never a corrupted file
        missing = [c for c in PEF_COLUMNS if c not in table.schema.names]
        if missing:
            raise ValueError(
                f"{path}: D_pef file lacks column(s) {missing}; it must come from "
                "`rllib presample` (columns prompt_ids, response_ids, ref_logp)."
            )
        table = table.select(list(PEF_COLUMNS))
        rows = np.arange(table.num_rows)[shard_index::num_shards]
        if len(rows) == 0:
            raise ValueError(
                f"{path}: {table.num_rows} D_pef rows leave learner {shard_index} of {num_shards} "
                "with none; use fewer learners or a larger D_pef."
            )
        columns = {name: table.column(name).to_pylist() for name in PEF_COLUMNS}
        self.prompt_ids = [columns["prompt_ids"][i] for i in rows]
        self.response_ids = [columns["response_ids"][i] for i in rows]
        self.ref_logp = [columns["ref_logp"][i] for i in rows]
        for j, i in enumerate(rows):
            if len(self.response_ids[j]) != len(self.ref_logp[j]) or not self.response_ids[j]:
                raise ValueError(
                    f"{path}: row {i}: response_ids has {len(self.response_ids[j])} tokens but "
                    f"ref_logp has {len(self.ref_logp[j])} values; they must match and be non-empty."
                )
        self._seed, self.shard_index, self.num_shards = seed, shard_index, num_shards
        self.rows_taken = 0
        self._order_pass, self._order = -1, np.arange(len(self.prompt_ids))

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def passes(self) -> int:
        """Passes over the shard begun so far."""
        return -(-self.rows_taken // len(self))

    def take(self, n: int) -> dict[str, np.ndarray]:
        """The next ``n`` rows as a batch (``ROW_TYPE_PEF``, ``REF_LOGP`` on response tokens)."""
        chosen: list[int] = []
        while len(chosen) < n:
            num_pass, at = divmod(self.rows_taken, len(self))
            if num_pass != self._order_pass:
                rng = np.random.default_rng([self._seed, self.shard_index, num_pass])
                self._order_pass, self._order = num_pass, rng.permutation(len(self))
            take = self._order[at : at + n - len(chosen)].tolist()
            chosen += take
            self.rows_taken += len(take)
        batch = sequence_rows(
            [self.prompt_ids[i] for i in chosen],
            [self.response_ids[i] for i in chosen],
            [self.ref_logp[i] for i in chosen],
            logp_column=C.REF_LOGP,
        )
        batch[C.ROW_TYPE] = np.full(n, C.ROW_TYPE_PEF, dtype=np.int64)
        batch[C.ADVANTAGES] = np.zeros(n, dtype=np.float32)
        batch[C.REWARDS] = np.ones(n, dtype=np.float32)
        batch[C.CORRECT] = np.ones(n, dtype=bool)
        batch[C.TRUNCATED] = np.zeros(n, dtype=bool)
        batch[C.GROUP_IDS] = np.full(n, -1, dtype=np.int64)
        return batch


class AddPefRows(ConnectorV2):
    """Learner connector piece: appends D_pef rows to each module's batch.

    For a batch with ``n_exp`` exploration rows it appends ``max(1, round(n_exp / ratio))``
    D_pef rows (paper: 2048 exploration rows + 256 D_pef rows per step, ratio 8).

    Args:
        path: The ``d_pef.parquet`` file.
        ratio: Exploration rows per D_pef row (> 0).
        shard_index, num_shards, seed: See :class:`PefRowSampler`.
    """

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        path: str,
        ratio: float = 8.0,
        shard_index: int = 0,
        num_shards: int = 1,
        seed: int = 0,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        if not ratio > 0:
            raise ValueError(f"ratio={ratio} must be > 0 (exploration rows per D_pef row; paper: 8).")
        self.ratio = ratio
        self.sampler = PefRowSampler(path, shard_index=shard_index, num_shards=num_shards, seed=seed)
        #: Every shard's rows taken, by shard index, as the learners last reported them
        #: (``DPHTorchLearner`` gathers them after each update); None until then.
        self.rows_taken_by_shard: Optional[list[int]] = None

    def num_pef_rows(self, num_exp_rows: int) -> int:
        return max(1, int(math.floor(num_exp_rows / self.ratio + 0.5)))

    def get_state(self, *args, **kwargs) -> dict:
        """The D_pef rows taken so far (the position in the shard's order), this shard's and, once
        gathered, every shard's: one learner's state restores every learner's position."""
        state = {"rows_taken": self.sampler.rows_taken}
        if self.rows_taken_by_shard is not None:
            state["rows_taken_by_shard"] = list(self.rows_taken_by_shard)
        return state

    def set_state(self, state: dict) -> None:
        """Continues from ``state``'s position of this shard (``rows_taken_by_shard[shard_index]``
        when it lists as many shards as there are now, else ``rows_taken``)."""
        by_shard = state.get("rows_taken_by_shard")
        if by_shard is not None and len(by_shard) == self.sampler.num_shards:
            self.sampler.rows_taken = int(by_shard[self.sampler.shard_index])
            self.rows_taken_by_shard = [int(n) for n in by_shard]
        else:
            self.sampler.rows_taken = int(state["rows_taken"])

    def __call__(
        self,
        *,
        rl_module: Any = None,
        batch: dict[str, dict[str, np.ndarray]],
        episodes: Optional[list] = None,
        explore: Optional[bool] = None,
        shared_data: Optional[dict] = None,
        metrics=None,
        **kwargs,
    ) -> dict[str, dict[str, np.ndarray]]:
        out = {}
        for module_id, columns in batch.items():
            num_exp = int((columns[C.ROW_TYPE] == C.ROW_TYPE_EXP).sum())
            out[module_id] = concat_batches([columns, self.sampler.take(self.num_pef_rows(num_exp))])
        return out
