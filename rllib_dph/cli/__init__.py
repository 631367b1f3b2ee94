"""The ``rllib`` command and what it runs before, around and after Ray Tune.

- :mod:`.main` — the entry point (``rllib``, ``python -m rllib_dph.cli``): argument parsing only;
- :mod:`.experiments` — ``rllib train`` and a tuned example run as a script: one experiment through Tune;
- :mod:`.preflight` — the checks of a run's settings before Ray starts;
- :mod:`.memory` — the memory estimate of every process of a run, which the preflight reads;
- :mod:`.imports` — the user's own modules (``--import``), imported here and in every Ray worker;
- :mod:`.console` — one line per training iteration;
- :mod:`.tracking` — W&B and MLflow through Tune's logger callbacks;
- :mod:`.interrupt` — Ctrl-C: the trials stop after their iteration, with a checkpoint;
- :mod:`.export` — ``rllib export``: a trained policy as a Hugging Face model folder.
"""
