"""The machinery under the GRPO-family learners, one concern per module.

- :mod:`.splits` — a rollout batch split for the learners: shards of whole groups, mini-batch plans,
  token-budget micro-batches, padding rows;
- :mod:`.step` — one optimizer step's shared state (:class:`~.step.Step`), handed to its loss calls;
- :mod:`.minibatches` — mini-batches of whole GRPO groups with D_pef rows in each;
- :mod:`.microbatches` — the optimizer step, in one pass or over token-budget micro-batches;
- :mod:`.finite` — skipping non-finite optimizer steps on all learners together;
- :mod:`.sharding` — FSDP2 shards instead of RLlib's DDP replicas (:class:`~.sharding.ShardedModules`);
- :mod:`.collectives` — whether this learner is one of several, and reductions over them;
- :mod:`.remote_calls` — the driver's calls to remote learners, with a timeout and errors that name the learner;
- :mod:`.base` — :class:`~.base.LLMTorchLearner`, which combines them; the algorithms' learners
  (``GRPOTorchLearner``, ``DPHTorchLearner``) add only their loss.
"""
