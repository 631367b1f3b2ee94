"""What is particular to the HF rollout engine: rows leaving the batch, extra stop tokens, chunking,
bfloat16 weights, the model types it refuses, and compiled decoding. The engine contract (μ,
top-K, top-p, seeding, EOS, weight updates, LoRA) is checked in tests/test_engine_conformance.py."""

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rllib_dph.engines import build_engine
from rllib_dph.engines.base import SamplingParams
from rllib_dph.engines.check import recompute_logp
from rllib_dph.engines.hf import HFEngine
from rllib_dph.models.hub import resolve_model

SENTENCES = [
    "select name , age from users where age > 30 order by name",
    "select count ( * ) from orders group by customer_id",
    "the answer is 42 because 6 times 7 equals 42",
    "what is the total price of all orders in 2024 ?",
    "find the average salary of employees per department",
]
# Prompts of different lengths, so that one batch is left-padded.
PROMPTS = [[5, 9, 11, 4, 20, 7, 8], [13], [30, 31, 6, 22]]


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<eos>"])
    tok.train_from_iterator(SENTENCES, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny random Qwen2 with tied embeddings and peaked enough next-token distributions."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        initializer_range=0.3,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture
def engine(model, tokenizer):
    return HFEngine(model, tokenizer)


def eos_biased_model(model, eos_id: int, bias: float) -> Qwen2ForCausalLM:
    """A copy of ``model`` whose EOS logit is raised by ``bias`` (an lm_head with a bias)."""
    biased = copy.deepcopy(model)
    weight = biased.lm_head.weight
    biased.lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    with torch.no_grad():
        biased.lm_head.weight.copy_(weight)
        biased.lm_head.bias.zero_()
        biased.lm_head.bias[eos_id] = bias
    return biased


def all_completions(groups):
    return [(PROMPTS[i], c) for i, group in enumerate(groups) for c in group]


def test_stops_on_eos_and_reports_finish_reason(model, tokenizer):
    eos = tokenizer.eos_token_id
    engine = HFEngine(eos_biased_model(model, eos, bias=2.0), tokenizer)
    params = SamplingParams(n=8, max_new_tokens=6, seed=0)
    completions = [c for _, c in all_completions(engine.generate(PROMPTS, params))]
    for c in completions:
        assert (c.token_ids[:-1] != eos).all()  # nothing after EOS
        assert len(c.logprobs) == len(c.token_ids)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == eos
        else:
            assert c.finish_reason == "length"
            assert len(c.token_ids) == 6 and c.token_ids[-1] != eos
    reasons = [c.finish_reason for c in completions]
    assert "stop" in reasons and "length" in reasons
    assert len({len(c.token_ids) for c in completions}) > 2  # rows left the batch at different steps


def test_extra_stop_token_ids(model, tokenizer):
    params = SamplingParams(n=4, max_new_tokens=12, seed=3)
    free = HFEngine(model, tokenizer).generate(PROMPTS, params)
    stop_id = int(free[0][0].token_ids[0])
    stopped = HFEngine(model, tokenizer, stop_token_ids=[stop_id]).generate(PROMPTS, params)
    assert stopped[0][0].token_ids.tolist() == [stop_id]
    for _, c in all_completions(stopped):
        assert (c.token_ids[:-1] != stop_id).all()
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in (stop_id, tokenizer.eos_token_id))


def test_n_completions_grouped_by_prompt_across_chunks(model, tokenizer):
    """Greedy output does not depend on chunking, so every group must match its own prompt."""
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=8)
    whole = HFEngine(model, tokenizer).generate(PROMPTS, params)
    chunked = HFEngine(model, tokenizer, max_batch_size=2).generate(PROMPTS, params)
    singles = [HFEngine(model, tokenizer).generate([p], params)[0] for p in PROMPTS]
    assert [len(g) for g in chunked] == [3, 3, 3]
    assert len({tuple(g[0].token_ids) for g in singles}) == len(PROMPTS)  # prompts give distinct outputs
    for group_whole, group_chunked, group_single in zip(whole, chunked, singles):
        for a, b in zip(group_whole + group_chunked, group_single + group_single):
            np.testing.assert_array_equal(a.token_ids, b.token_ids)


def test_bfloat16_model(model, tokenizer):
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    engine = HFEngine(bf16, tokenizer)
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=8, seed=0, top_k_logprobs=2)
    for prompt, c in all_completions(engine.generate(PROMPTS, params)):
        assert c.logprobs.dtype == np.float32 and c.topk_logprobs.dtype == np.float32
        logp = recompute_logp(bf16, prompt, c.token_ids, 0.7)
        expected = logp.gather(1, torch.from_numpy(c.token_ids)[:, None]).squeeze(1)
        np.testing.assert_allclose(c.logprobs, expected.numpy(), atol=0.05)
    fp32 = {k: v + 0.01 for k, v in model.state_dict().items()}  # a mixed-precision learner's weights
    engine.update_weights(fp32)
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight  # still tied
    assert engine.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(engine.model.model.embed_tokens.weight, fp32["model.embed_tokens.weight"].bfloat16())


def test_sliding_window_model_is_refused(tokenizer):
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        use_sliding_window=True,
        max_window_layers=1,  # layers from index 1 on use sliding-window attention
    )
    with pytest.raises(ValueError, match="sliding_attention"):
        HFEngine(Qwen2ForCausalLM(config), tokenizer)


def test_build_engine_passes_config_to_from_pretrained(monkeypatch):
    calls = []

    def fake_from_pretrained(cls, name_or_path, **kwargs):
        calls.append((name_or_path, kwargs))
        return "engine"

    monkeypatch.setattr(HFEngine, "from_pretrained", classmethod(fake_from_pretrained))
    config = SimpleNamespace(
        engine="hf",
        model_name="tiny-random",
        dtype="float32",
        engine_kwargs={"dtype": "bfloat16", "max_batch_size": 8},
        num_gpus_per_env_runner=0,
    )
    assert build_engine(config) == "engine"
    assert calls == [(resolve_model("tiny-random"), {"dtype": "bfloat16", "max_batch_size": 8, "device": "cpu"})]
    config.lora = {"r": 4}  # a LoRA policy's engine is started ready for its adapters
    build_engine(config)
    assert calls[-1][1]["lora"] == {"r": 4}
    with pytest.raises(ValueError, match="engine='nope'"):
        build_engine(SimpleNamespace(engine="nope"))


# ---------------------------------------------------------------- compiled decode (static KV cache)


@pytest.fixture(scope="module")
def compiled_pair(model, tokenizer):
    """(eager, compiled) engines on one EOS-biased model (rows stop at different steps).

    Module-scoped: each (rows, length) bucket of the compiled engine compiles once (~20 s on CPU).
    """
    biased = eos_biased_model(model, tokenizer.eos_token_id, bias=0.5)
    return HFEngine(biased, tokenizer), HFEngine(biased, tokenizer, compile_decode=True)


def test_compiled_decode_is_off_by_default(engine):
    assert engine.compiled is None


def test_compiled_decode_matches_eager_and_mu_is_exact(compiled_pair):
    eager, compiled = compiled_pair
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=10, top_k_logprobs=2)
    expected, got = eager.generate(PROMPTS, greedy), compiled.generate(PROMPTS, greedy)
    for (_, a), (_, b) in zip(all_completions(expected), all_completions(got)):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(b.logprobs, np.zeros(len(b.token_ids)))  # point mass
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)
        assert a.finish_reason == b.finish_reason
    assert {c.finish_reason for _, c in all_completions(got)} == {"stop", "length"}

    sampled = compiled.generate(PROMPTS, SamplingParams(n=4, temperature=0.8, max_new_tokens=10, seed=0))
    lengths = {len(c.token_ids) for _, c in all_completions(sampled)}
    assert len(lengths) > 2  # finished rows stayed in the batch; each is cut at its own length
    for prompt, c in all_completions(sampled):
        logp = recompute_logp(compiled.model, prompt, c.token_ids, 0.8)
        expected_mu = logp.gather(1, torch.from_numpy(c.token_ids)[:, None]).squeeze(1)
        np.testing.assert_allclose(c.logprobs, expected_mu.numpy(), atol=1e-4)
        assert (c.token_ids[:-1] != compiled.tokenizer.eos_token_id).all()


def test_compiled_decode_reuses_a_bucket_and_hides_stale_cache(compiled_pair):
    eager, compiled = compiled_pair
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=10)
    compiled.generate(PROMPTS, greedy)  # fills the (16 rows, 128 positions) bucket with these prompts
    other = [[7, 8, 9], [21, 3, 3, 5, 6, 2, 9, 9, 10]]  # other rows and lengths, same bucket
    for a, b in zip(eager.generate(other, greedy), compiled.generate(other, greedy)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.token_ids, y.token_ids)
    assert list(compiled.compiled.caches) == [(16, 128)]
    many = SamplingParams(n=6, temperature=0.0, max_new_tokens=10)  # 18 rows: the next row bucket
    for a, b in zip(eager.generate(PROMPTS, many), compiled.generate(PROMPTS, many)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.token_ids, y.token_ids)
    assert sorted(compiled.compiled.caches) == [(16, 128), (32, 128)]


def test_compiled_buckets_pad_rows_and_length_up_to_the_row_limit(model, tokenizer):
    decoder = HFEngine(model, tokenizer, max_batch_size=20, compile_decode=True).compiled
    assert decoder.bucket(1, 20) == (16, 128)
    assert decoder.bucket(16, 128) == (16, 128)
    assert decoder.bucket(17, 129) == (20, 256)  # not past max_batch_size rows


def test_compiled_decode_follows_weight_updates(compiled_pair):
    """update_weights copies in place: the compiled graph must read the new weights, not a frozen copy."""
    eager, compiled = compiled_pair  # one model object behind both engines
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    before = compiled.generate(PROMPTS, greedy)
    original = {k: v.clone() for k, v in compiled.model.state_dict().items()}
    torch.manual_seed(1)
    compiled.update_weights({k: v + 0.3 * torch.randn_like(v) for k, v in original.items()})
    try:
        after, expected = compiled.generate(PROMPTS, greedy), eager.generate(PROMPTS, greedy)
    finally:
        compiled.update_weights(original)
    assert any(not np.array_equal(a[0].token_ids, b[0].token_ids) for a, b in zip(before, after))
    for a, b in zip(after, expected):
        np.testing.assert_array_equal(a[0].token_ids, b[0].token_ids)
