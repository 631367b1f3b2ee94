"""Building the bundled models: the tiny models (``tiny``), the SmolLM2 conversion (``smollm2``),
the warm starts (``warm_start``) and the supervised fine-tuning they share (``sft``)."""
