"""Models: the bundled base models (tiny ones built offline, SmolLM2 converted from its GGUF file,
warm starts) and loading of any model by name, folder or HF id.

Layers, each importing only those below it: ``folders`` (load a folder) <- ``catalog`` (what the
bundled models are, which builds are current) <- ``hub`` (names -> folders; never builds) <-
``build/`` (``tiny``, ``smollm2``, ``sft``, ``warm_start`` build a folder; ``prepare`` builds the
bundled models a run names, for ``rllib build-model`` and the preparation step of a run).
"""
