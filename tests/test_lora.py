"""LoRA (``GRPOConfig.llm(lora=...)``): validation, adapter-only training and Adam state, the
adapter weight sync into the HF engine, the free reference model, checkpoints and export."""

import json

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_dph import columns as C
from rllib_dph.policy import lora
from rllib_dph.engines.base import SamplingParams
from rllib_dph.engines.hf import HFEngine
from rllib_dph.models.hub import load_causal_lm, load_tokenizer, resolve_model
from rllib_dph.policy.rl_module import LOGP, ResponseLM, sequence_logprobs

from extras import needs_peft

pytestmark = needs_peft  # every test here builds LoRA adapters

LORA = {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}


@pytest.fixture
def lora_config(tiny_grpo_config):
    return tiny_grpo_config.copy(copy_frozen=False).llm(lora=dict(LORA))


@pytest.fixture
def env_runner(lora_config):
    from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner

    return LLMEnvRunner(config=lora_config)


def _randomize_adapters(model, seed=0):
    """Non-zero B (peft starts B at 0, where the adapted model equals its base)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if lora.is_adapter_key(name):
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))


def _batch(env_runner, seed=0):
    from rllib_dph.losses.advantages import group_advantages

    batch = env_runner.sample(num_prompts=2)
    batch[C.REWARDS] = np.random.default_rng(seed).integers(0, 2, len(batch[C.REWARDS])).astype(np.float32)
    batch[C.ADVANTAGES] = group_advantages(torch.as_tensor(batch[C.REWARDS]), torch.as_tensor(batch[C.GROUP_IDS])).numpy()
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=len(batch[C.REWARDS]))


# ---------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"lora": 16}, "lora=16 is invalid: it must be None or a dict"),
        ({"lora": {"rank": 8}}, "lora has unknown keys ['rank']: the keys are"),
        ({"lora": {"r": 0}}, "lora['r']=0 is invalid: the adapter rank must be an int >= 1"),
        ({"lora": {"r": 8.0}}, "lora['r']=8.0 is invalid"),
        ({"lora": {"alpha": float("nan")}}, "lora['alpha']=nan is invalid: it must be a finite number > 0"),
        ({"lora": {"target_modules": []}}, "lora['target_modules']=[] is invalid: it must be 'all-linear' or a non-empty list"),
        ({"lora": {"dropout": 1.0}}, "lora['dropout']=1.0 is invalid: it must be a number in [0, 1)"),
        ({"lora": {}, "reference_model": "tiny-sql-math", "kl_coeff": 0.1}, "reference_model='tiny-sql-math' with lora="),
    ],
)
def test_validate_names_value_rule_and_fix(tiny_grpo_config, overrides, message):
    config = tiny_grpo_config.copy(copy_frozen=False)
    config.update_from_dict(overrides)
    with pytest.raises(ValueError) as err:
        config.validate()
    assert message in str(err.value)


def test_valid_settings_validate(tiny_grpo_config):
    for value in (None, {}, dict(LORA), {"target_modules": ["q_proj", "v_proj"]}):
        tiny_grpo_config.copy(copy_frozen=False).llm(lora=value).validate()


# ---------------------------------------------------------------------------------- learner
def _check_adapter_only_update(config, env_runner):
    learner = config.build_learner(env=env_runner.env)
    model = learner.module[DEFAULT_MODULE_ID].model
    adapters = {n for n, _ in model.named_parameters() if lora.is_adapter_key(n)}
    optimized = {id(p) for g in learner.get_optimizer().param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in model.named_parameters() if n in adapters}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner.update(batch=_batch(env_runner), num_epochs=1, minibatch_size=8)
    after = model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and moved <= adapters  # only adapters train; the base stays frozen
    assert any(".lora_B." in k for k in moved)  # B leaves 0
    state = learner.get_optimizer().state
    assert state and {id(p) for p in state} <= optimized  # Adam state for the adapters only
    assert all(v.dtype == torch.float32 for s in state.values() for k, v in s.items() if k != "step")
    return learner


def test_learner_trains_adapters_only_with_adam_state_for_adapters(lora_config, env_runner):
    learner = _check_adapter_only_update(lora_config, env_runner)
    assert learner.ref_model is None


def test_bfloat16_and_gradient_checkpointing(lora_config, env_runner):
    config = lora_config.copy(copy_frozen=False).llm(dtype="bfloat16", gradient_checkpointing=True)
    _check_adapter_only_update(config, env_runner)


# ---------------------------------------------------------------------------------- rollouts
def _merged(model):
    plain = load_causal_lm("tiny-random", dtype=torch.float32)
    plain.load_state_dict(lora.merged_state(model), strict=True)
    return plain


def test_engine_with_synced_adapters_equals_a_merged_model(tiny_grpo_config):
    """The adapter state (tensors only) into a base-model engine: greedy tokens and μ equal those
    of an engine on the merged weights W + (alpha/r)·B·A, within 1e-4 in fp32."""
    policy = lora.add_adapters(load_causal_lm("tiny-random", dtype=torch.float32), LORA)
    _randomize_adapters(policy)
    state = lora.adapter_state(policy, LORA)
    assert all(lora.is_adapter_key(k) for k in state if k != lora.LORA_SETTINGS)  # no base tensor moves
    tokenizer = load_tokenizer("tiny-random")
    engine = HFEngine.from_pretrained(resolve_model("tiny-random"), dtype="float32")
    base_out = engine.generate([tokenizer.encode("SELECT name FROM")], SamplingParams(temperature=1.0, max_new_tokens=12, seed=0))
    engine.update_weights(state)
    merged = HFEngine(_merged(policy), tokenizer)
    prompts = [tokenizer.encode("SELECT name FROM"), tokenizer.encode("what is 2+2?")]
    for params in (SamplingParams(temperature=0.0, max_new_tokens=12), SamplingParams(temperature=0.7, max_new_tokens=12, n=3, seed=1)):
        ours, theirs = engine.generate(prompts, params), merged.generate(prompts, params)
        for a, b in zip(sum(ours, []), sum(theirs, [])):
            np.testing.assert_array_equal(a.token_ids, b.token_ids)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    adapted = engine.generate([prompts[0]], SamplingParams(temperature=1.0, max_new_tokens=12, seed=0))
    assert not np.allclose(adapted[0][0].logprobs, base_out[0][0].logprobs, atol=1e-3)  # the adapters are in use
    # A second sync loads new adapter values in place.
    _randomize_adapters(policy, seed=1)
    engine.update_weights(lora.adapter_state(policy, LORA))
    merged = HFEngine(_merged(policy), tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    np.testing.assert_array_equal(engine.generate(prompts, greedy)[0][0].token_ids, merged.generate(prompts, greedy)[0][0].token_ids)


def test_first_batch_is_on_policy_after_the_adapter_sync(lora_config, env_runner):
    """The learner's adapters, synced into the env runner's engine: π_θ = μ before any update."""
    learner = lora_config.build_learner(env=env_runner.env)
    module = learner.module[DEFAULT_MODULE_ID]
    _randomize_adapters(module.model)
    env_runner.set_state({"rl_module": module.get_state()})
    batch = _batch(env_runner).policy_batches[DEFAULT_MODULE_ID]
    inputs = {k: torch.as_tensor(batch[k]) for k in (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)}
    with torch.no_grad():
        logp = module._forward_train(inputs)[LOGP].numpy()
    mask = batch[C.RESPONSE_MASK].astype(bool)
    np.testing.assert_allclose(logp[mask], batch[C.BEHAVIOR_LOGP][mask], atol=1e-4)


# ---------------------------------------------------------------------------------- reference
def test_reference_is_the_base_with_adapters_disabled(lora_config, env_runner):
    """kl_coeff > 0: no second model; π_ref equals a separately loaded base model within 1e-5,
    while π_θ (adapters on) differs from it."""
    config = lora_config.copy(copy_frozen=False).training(kl_coeff=0.1)
    learner = config.build_learner(env=env_runner.env)
    assert learner.ref_model is None
    module = learner.module[DEFAULT_MODULE_ID]
    _randomize_adapters(module.model)
    batch = _batch(env_runner).policy_batches[DEFAULT_MODULE_ID]
    inputs = {k: torch.as_tensor(batch[k]) for k in (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)}
    ref = learner.reference_logp(inputs)
    base = ResponseLM(load_causal_lm("tiny-random", dtype=torch.float32)).eval()
    with torch.no_grad():
        logits, where = base.logits(inputs)
        full = torch.zeros(where.shape + logits.shape[-1:])
        full[where] = logits
        expected = sequence_logprobs(full, inputs, temperature=config.temperature) * inputs[C.RESPONSE_MASK]
        policy = module._forward_train(inputs)[LOGP]
    mask = inputs[C.RESPONSE_MASK].bool()
    torch.testing.assert_close(ref[mask], expected[mask], atol=1e-5, rtol=0)
    assert (policy[mask] - ref[mask]).abs().max() > 1e-3
    logged = learner.update(batch=_batch(env_runner, seed=1), num_epochs=1, minibatch_size=8)[DEFAULT_MODULE_ID]
    assert logged["kl_loss"].peek() > 0


# ---------------------------------------------------------------------------------- checkpoints
def test_learner_checkpoint_keeps_adapters_and_their_adam_state(lora_config, env_runner, tmp_path):
    learner = lora_config.build_learner(env=env_runner.env)
    learner.update(batch=_batch(env_runner), num_epochs=1, minibatch_size=8)
    state = learner.get_state()
    module_state = state["rl_module"][DEFAULT_MODULE_ID]
    assert lora.is_lora_state(module_state)
    assert all(lora.is_adapter_key(k) for k in module_state if k != lora.LORA_SETTINGS)
    learner.save_to_path(str(tmp_path))
    restored = lora_config.build_learner(env=env_runner.env)
    restored.restore_from_path(str(tmp_path))
    new_state = restored.get_state()
    for k, v in module_state.items():
        if k != lora.LORA_SETTINGS:
            assert torch.equal(new_state["rl_module"][DEFAULT_MODULE_ID][k], v), k
    assert str(new_state["optimizer"]) == str(state["optimizer"])


@pytest.fixture(scope="module")
def lora_checkpoint(ray_session, tmp_path_factory):
    """An Algorithm checkpoint of GRPO with LoRA on tiny-random, one training iteration and
    random non-zero adapters (so that it differs from its base)."""
    from rllib_dph.algorithms.grpo import GRPOConfig

    config = (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=8, lora=dict(LORA))
        .training(group_size=2, prompts_per_step=2, kl_coeff=0.1)
    )
    algo = config.build_algo()
    algo.train()
    state = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
    generator = torch.Generator().manual_seed(0)
    perturbed = {k: v if k == lora.LORA_SETTINGS else 0.2 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    algo.learner_group.set_weights({DEFAULT_MODULE_ID: perturbed})
    path = tmp_path_factory.mktemp("lora") / "ckpt"
    algo.save_to_path(str(path))
    algo.stop()
    return path


def _prompt_ids(tokenizer):
    from rllib_dph.chat import encode_prompt

    return torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": "SELECT the answer"}])])  # (1, T)


def test_export_merged_and_adapter_only_have_the_checkpoints_logits(lora_checkpoint, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllib_dph.cli.main import main
    from rllib_dph.cli.export import EXPORT_RECORD, load_checkpoint_policy

    policy = load_checkpoint_policy(lora_checkpoint).model.eval()
    main(["export", str(lora_checkpoint), str(tmp_path / "merged")])
    main(["export", str(lora_checkpoint), str(tmp_path / "adapter"), "--adapter-only"])
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "adapter").iterdir()}
    assert not any(p.name.startswith("adapter_") for p in (tmp_path / "merged").iterdir())
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random")).eval()
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ids = _prompt_ids(AutoTokenizer.from_pretrained(tmp_path / "merged"))
    with torch.no_grad():
        expected = policy(ids).logits  # (1, T, V)
        # Merging computes x(W + sBA) instead of xW + s(xA)B: another fp32 summation order, whose
        # rounding (up to 2.7e-5 seen here, with threads and load) stays within 1e-4.
        torch.testing.assert_close(merged(ids).logits, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(adapted(ids).logits, expected, atol=1e-5, rtol=0)
        assert not torch.allclose(expected, load_causal_lm("tiny-random")(ids).logits, atol=1e-3)
    record = json.loads((tmp_path / "adapter" / EXPORT_RECORD).read_text())
    assert record["adapter_only"] and record["lora"]["r"] == LORA["r"]


def test_checkpoint_round_trips_through_from_checkpoint(lora_checkpoint):
    """Algorithm.from_checkpoint restores adapters and Adam state and trains on."""
    from ray.rllib.algorithms.algorithm import Algorithm

    from rllib_dph.cli.export import load_checkpoint_policy

    saved = load_checkpoint_policy(lora_checkpoint).get_state()
    algo = Algorithm.from_checkpoint(str(lora_checkpoint))
    try:
        state = algo.learner_group.get_state()["learner"]
        for k, v in saved.items():
            if k != lora.LORA_SETTINGS:
                assert torch.equal(state["rl_module"][DEFAULT_MODULE_ID][k], v), k
        optimizer = next(iter(state["optimizer"].values()))["state"]
        assert len(optimizer["param_groups"][0]["params"]) == sum(1 for k in saved if k != lora.LORA_SETTINGS)
        result = algo.train()
        assert result["training_iteration"] == 2
    finally:
        algo.stop()


def test_adapter_only_export_refuses_a_full_checkpoint(ray_session, tmp_path):
    from rllib_dph.algorithms.grpo import GRPOConfig
    from rllib_dph.cli.main import main

    config = (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=8)
        .training(group_size=2, prompts_per_step=2)
    )
    algo = config.build_algo()
    algo.save_to_path(str(tmp_path / "ckpt"))
    algo.stop()
    with pytest.raises(SystemExit, match="was trained without LoRA"):
        main(["export", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--adapter-only"])

