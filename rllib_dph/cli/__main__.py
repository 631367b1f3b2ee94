"""``python -m rllib_dph.cli ...``: the ``rllib`` command run by the interpreter at hand."""

from rllib_dph.cli.main import main

main()
