"""The learner's forward runs each distinct prompt once (a GRPO group shares it) and gives the
full forward's log-probs and gradients; it falls back to the full forward where sharing cannot
apply or would not pay."""

import numpy as np
import pytest
import torch

from rllib_dph import columns as C
from rllib_dph.models.hub import load_causal_lm, resolve_model
from rllib_dph.policy.rl_module import response_logits, shared_prompt_hidden


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return load_causal_lm(resolve_model("tiny-random"), dtype=torch.float32).train()


def _batch(rows: list[tuple[list[int], list[int]]], extra_width: int = 2) -> dict[str, torch.Tensor]:
    """Right-padded ``prompt + response`` rows; a row with an empty prompt and response is a padding row."""
    width = max(len(p) + len(r) for p, r in rows) + extra_width
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention, response = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attention[i, : len(p) + len(r)] = 1
        response[i, len(p) : len(p) + len(r)] = 1
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: attention, C.RESPONSE_MASK: response}


def _groups(vocab: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """3 groups of 4 rows (prompts of different lengths, responses of 1-12 tokens), one row with a
    prompt of its own (a D_pef row) and one padding row."""
    rng = np.random.default_rng(seed)
    rows = []
    for prompt_len in (9, 14, 6):
        prompt = rng.integers(5, vocab, prompt_len).tolist()
        rows += [(prompt, rng.integers(5, vocab, rng.integers(1, 13)).tolist()) for _ in range(4)]
    rows.append((rng.integers(5, vocab, 11).tolist(), rng.integers(5, vocab, 7).tolist()))
    rows.append(([], []))
    return rows


def _grads(model, logits):
    return torch.autograd.grad(logits.logsumexp(-1).sum(), [p for p in model.parameters() if p.requires_grad])


def test_shared_prompts_give_the_full_forward_and_its_gradients(model):
    batch = _batch(_groups(model.config.vocab_size))
    assert shared_prompt_hidden(model.get_decoder(), batch) is not None  # the shared path is taken
    full, where_full = response_logits(model, batch, share_prompts=False)
    shared, where = response_logits(model, batch)
    assert torch.equal(where, where_full)
    torch.testing.assert_close(shared, full, atol=1e-4, rtol=0)
    for g_shared, g_full in zip(_grads(model, shared), _grads(model, full)):
        torch.testing.assert_close(g_shared, g_full, atol=1e-5, rtol=1e-4)


def test_no_shared_prompt_takes_the_full_forward(model):
    rows = [r for r in _groups(model.config.vocab_size) if r[0]]
    unique = [rows[0], rows[4], rows[8], rows[12]]  # one row per prompt
    assert shared_prompt_hidden(model.get_decoder(), _batch(unique)) is None


def test_rows_that_are_not_prompt_then_response_take_the_full_forward(model):
    batch = _batch(_groups(model.config.vocab_size))
    batch[C.ATTENTION_MASK][0, 0] = 0  # a hole in a row's prompt
    assert shared_prompt_hidden(model.get_decoder(), batch) is None


def test_activation_checkpointing_takes_the_full_forward(model):
    batch = _batch(_groups(model.config.vocab_size))
    full, _ = response_logits(model, batch, share_prompts=False)
    model.activation_checkpointing_enable({"use_reentrant": False})
    try:
        checkpointed, _ = response_logits(model, batch)
    finally:
        model.activation_checkpointing_disable()
    torch.testing.assert_close(checkpointed, full, atol=1e-5, rtol=0)
