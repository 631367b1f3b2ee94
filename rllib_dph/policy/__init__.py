"""The policy: the language model that is trained, as RLlib sees it and as it is saved.

- :mod:`.rl_module` — :class:`~.rl_module.LLMRLModule`, an RLlib ``TorchRLModule`` around a
  Hugging Face causal LM, and the forward of the response tokens' log-probs the learners use;
- :mod:`.lora` — LoRA adapters on the policy: settings, adding them, their state, merging;
- :mod:`.full_state` — the full state of a policy whose parameters are FSDP2 shards.
"""
