"""Models: the bundled base models (tiny ones built offline, SmolLM2 converted from its GGUF file,
warm starts) and loading of any model by name, folder or HF id.

Layers, each importing only those below it: ``folders`` (load a folder) <- ``sft``, ``tiny``,
``smollm2``, ``warm_start`` (build a folder) <- ``hub`` (names -> folders, building on first use).
"""
