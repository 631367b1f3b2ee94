"""The machinery under the GRPO-family learners, one concern per module.

- :mod:`.step` — one optimizer step's shared state (:class:`~.step.Step`), handed to its loss calls;
- :mod:`.minibatches` — mini-batches of whole GRPO groups with D_pef rows in each;
- :mod:`.microbatches` — the optimizer step, in one pass or over token-budget micro-batches;
- :mod:`.finite` — skipping non-finite optimizer steps on all learners together;
- :class:`rllib_dph.sharding.ShardedModules` — FSDP2 shards instead of RLlib's DDP replicas;
- :mod:`.base` — :class:`~.base.LLMTorchLearner`, which combines them; the algorithms' learners
  (``GRPOTorchLearner``, ``DPHTorchLearner``) add only their loss.
"""
