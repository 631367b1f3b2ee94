"""The one rollout path: prompts → engine → env → scored groups of episodes.

- :mod:`.episodes`: :func:`~.episodes.rollout` and :func:`~.episodes.rollout_chunks`, which run
  episodes of an env with a rollout engine, turn by turn, and score them
  (:class:`~.episodes.ScoredGroup`);
- :mod:`.batch`: the rows of a rollout batch, laid out from prompts and responses
  (:func:`~.batch.sequence_rows`), joined and selected.

The public names of :mod:`.episodes` are importable from here too.
"""

from rllib_dph.rollout.episodes import Episode, Rollout, ScoredGroup, encode_task, rollout, rollout_chunks, take_turn

__all__ = ["Episode", "Rollout", "ScoredGroup", "encode_task", "rollout", "rollout_chunks", "take_turn"]
