"""The learner's work at its floor: the LM head on response positions only, padding cut, and
token-budget micro-batches whose accumulated gradient is exactly the whole mini-batch's."""

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_dph import columns as C
from rllib_dph.learners.splits import token_budget_microbatches, trim_padding
from rllib_dph.losses.tokens import AGGREGATIONS, token_entropy
from rllib_dph.policy.rl_module import ENTROPY, LOGP, TOPK_LOGP, next_token_logits, sequence_logprobs

from test_update_correctness import _dph_config, _exploration_batch, _wrap, envs_make, pef_file  # noqa: F401


def test_response_only_forward_equals_the_full_forward(pef_file):  # noqa: F811
    config = _dph_config(pef_file).llm(temperature=0.7).training(rollout_top_k=3)
    learner = config.build_learner(env=envs_make())
    module = learner.module[DEFAULT_MODULE_ID]
    batch = {k: torch.as_tensor(v) for k, v in _exploration_batch(config, num_prompts=3).items()}
    with torch.no_grad():
        out = module.forward_train(batch)
        logits = next_token_logits(module.model, batch)  # (B, L-1, V): every position
    response = batch[C.RESPONSE_MASK].bool()
    full_logp = sequence_logprobs(logits, batch, 0.7)
    full_entropy = torch.nn.functional.pad(token_entropy(logits, temperature=0.7), (1, 0))
    scaled = torch.log_softmax(logits / 0.7, -1).gather(-1, batch[C.TOPK_IDS][:, 1:])
    full_topk = torch.nn.functional.pad(scaled, (0, 0, 1, 0))
    torch.testing.assert_close(out[LOGP][response], full_logp[response], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[ENTROPY][response], full_entropy[response], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[TOPK_LOGP][response], full_topk[response], atol=1e-5, rtol=0)
    assert (out[LOGP][~response] == 0).all() and (out[ENTROPY][~response] == 0).all()


def test_trim_padding_cuts_per_token_columns_only():
    batch = {
        C.INPUT_IDS: np.ones((2, 6), dtype=np.int64),
        C.ATTENTION_MASK: np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]),
        C.TOPK_IDS: np.zeros((2, 6, 3), dtype=np.int64),
        C.ADVANTAGES: np.ones(2, dtype=np.float32),
    }
    trimmed = trim_padding(batch)
    assert trimmed[C.INPUT_IDS].shape == (2, 4) and trimmed[C.TOPK_IDS].shape == (2, 4, 3)
    assert trimmed[C.ADVANTAGES].shape == (2,)


def test_token_budget_microbatches_pack_rows_of_similar_length():
    lengths = np.array([10, 3, 9, 4, 30, 2])
    groups = token_budget_microbatches(lengths, 20)
    assert sorted(np.concatenate(groups).tolist()) == list(range(6))
    assert groups[0].tolist() == [4]  # longer than the budget: alone
    for rows in groups[1:]:
        assert lengths[rows].max() * len(rows) <= 20


def _grads_after_update(config, batch):
    learner = config.build_learner(env=envs_make())
    forwards = []
    module = learner.module[DEFAULT_MODULE_ID]
    original = module.forward_train
    module.forward_train = lambda b, **kw: forwards.append(1) or original(b, **kw)
    learner.update(batch=_wrap(batch))
    grads = torch.cat([p.grad.flatten() for p in module.model.parameters() if p.grad is not None])
    return grads, len(forwards)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_microbatch_gradients_equal_the_whole_minibatch(pef_file, mode):  # noqa: F811
    """1 pass vs >= 4 accumulated micro-batches, exploration and D_pef rows: the same gradient."""
    base = _dph_config(pef_file, pef_ratio=4.0).training(loss_agg_mode=mode, lr=1e-12, entropy_coeff=0.01)
    batch = _exploration_batch(base, num_prompts=4)  # 16 exploration rows, + 4 D_pef rows
    whole, passes = _grads_after_update(base, batch)
    longest = int(batch[C.ATTENTION_MASK].sum(-1).max())
    micro = base.copy(copy_frozen=False).training(max_tokens_per_microbatch=4 * longest)
    accumulated, micro_passes = _grads_after_update(micro, batch)
    assert passes == 1 and micro_passes >= 4
    torch.testing.assert_close(accumulated, whole, atol=1e-6, rtol=0)
    assert whole.abs().max() > 1e-4  # a real gradient was compared


def test_token_budget_microbatches_keep_a_group_whole_when_it_fits():
    lengths = np.array([10, 3, 9, 4, 8, 2, 5])
    units = np.array([7, 7, 7, 9, 9, 5, 11])  # groups 7 and 9, two rows of their own
    batches = token_budget_microbatches(lengths, 30, units)
    assert sorted(np.concatenate(batches).tolist()) == list(range(7))
    for rows in batches:
        assert lengths[rows].max() * len(rows) <= 30
    where = {row: i for i, rows in enumerate(batches) for row in rows.tolist()}
    assert where[0] == where[1] == where[2] and where[3] == where[4]  # whole groups
    too_big = token_budget_microbatches(lengths, 20, units)  # group 7 (3 x 10 tokens) cannot fit
    assert all(lengths[rows].max() * len(rows) <= 20 or len(rows) == 1 for rows in too_big)
