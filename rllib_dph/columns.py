"""Column names of rollout and training batches.

Every row is one sequence ``prompt + response`` right-padded to the batch length ``L``.
Per-token columns are aligned with ``INPUT_IDS``: the value at position ``t`` belongs to the
token ``INPUT_IDS[:, t]`` (e.g. its behaviour log-prob), and is meaningful only where
``RESPONSE_MASK`` is true.
"""

# Per-token columns, shape (B, L).
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"  # 1 on prompt and response tokens, 0 on padding
# 1 on the response tokens the policy sampled: the tokens every loss term is taken over; 0 on the
# prompt, padding and a multi-turn episode's env observations (holes inside the response).
RESPONSE_MASK = "response_mask"
BEHAVIOR_LOGP = "behavior_logp"  # μ: log-prob of each sampled token under the rollout engine
REF_LOGP = "ref_logp"  # log π_ref of each token (stored for D_pef rows, computed for the KL penalty)
ANCHOR_LOGP = "anchor_logp"  # trust-region anchor when it is not μ (the "recompute" ablation)

# Top-K log-probs of the rollout distribution, shape (B, L, K).
TOPK_IDS = "topk_ids"
TOPK_BEHAVIOR_LOGP = "topk_behavior_logp"
TOPK_ANCHOR_LOGP = "topk_anchor_logp"

# Per-row columns, shape (B,).
REWARDS = "rewards"
ADVANTAGES = "advantages"
GROUP_IDS = "group_ids"  # rows sharing a group id are completions of the same prompt
ROW_TYPE = "row_type"  # ROW_TYPE_EXP (online exploration rollout) or ROW_TYPE_PEF (D_pef reference)
PROMPT_LENGTH = "prompt_length"
RESPONSE_LENGTH = "response_length"
CORRECT = "correct"
TRUNCATED = "truncated"  # the response hit the token limit before EOS
# The weight version (RLlib's WEIGHTS_SEQ_NO: learner updates so far) a row was sampled with; set
# by ``LLMEnvRunner.sample_round`` and removed by ``SamplingRounds.strip_versions`` before the update.
WEIGHT_VERSION = "weight_version"

ROW_TYPE_EXP = 0
ROW_TYPE_PEF = 1
