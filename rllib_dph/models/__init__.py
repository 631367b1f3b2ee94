"""Models: the bundled tiny base models (built offline) and loading of any model by name, path or HF id."""

from rllib_dph.models.hub import (
    build_model,
    load_causal_lm,
    load_tokenizer,
    model_fingerprint,
    resolve_model,
    rllib_dph_home,
)
from rllib_dph.models.tiny import TINY_MODELS

__all__ = [
    "TINY_MODELS",
    "build_model",
    "load_causal_lm",
    "load_tokenizer",
    "model_fingerprint",
    "resolve_model",
    "rllib_dph_home",
]
