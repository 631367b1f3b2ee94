"""`rllib export`: a checkpoint's policy as a Hugging Face folder that transformers loads as is."""

import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rllib_dph.chat import encode_prompt
from rllib_dph.cli.main import main
from rllib_dph.cli.export import EXPORT_RECORD, load_checkpoint_policy
from rllib_dph.models.hub import load_causal_lm


@pytest.fixture(scope="module")
def checkpoint(ray_session, tmp_path_factory):
    """An Algorithm checkpoint of GRPO on tiny-random whose decoder weights differ from the base model."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_dph.algorithms.grpo import GRPOConfig

    config = (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=8)
        .training(group_size=2, prompts_per_step=2)
    )
    algo = config.build_algo()
    weights = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
    generator = torch.Generator().manual_seed(0)
    perturbed = {
        k: v + 0.1 * torch.randn(v.shape, generator=generator) if ".layers." in k else v for k, v in weights.items()
    }
    algo.learner_group.set_weights({DEFAULT_MODULE_ID: perturbed})
    path = tmp_path_factory.mktemp("export") / "ckpt"
    algo.save_to_path(str(path))
    algo.stop()
    return path


def test_exported_model_has_the_checkpoint_policys_logits(checkpoint, tmp_path):
    out = tmp_path / "hf"
    main(["export", str(checkpoint), str(out)])
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja",
            EXPORT_RECORD} <= files
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": "SELECT the answer"}])])  # (1, T)
    policy = load_checkpoint_policy(checkpoint).model.eval()
    with torch.no_grad():
        logits = exported(ids).logits  # (1, T, V)
        assert torch.equal(logits, policy(ids).logits)
        assert not torch.allclose(logits, load_causal_lm("tiny-random")(ids).logits)  # trained, not the base
    assert GenerationConfig.from_pretrained(out).eos_token_id == tokenizer.eos_token_id
    assert json.loads((out / EXPORT_RECORD).read_text())["base_model"] == "tiny-random"


def test_export_in_bfloat16(checkpoint, tmp_path):
    main(["export", str(checkpoint), str(tmp_path / "bf16"), "--dtype", "bfloat16"])
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16


def test_export_refuses_a_folder_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="not an RLlib Algorithm checkpoint"):
        main(["export", str(tmp_path), str(tmp_path / "out")])


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (see .ci/vllm)")
def test_vllm_loads_the_export_and_decodes_like_transformers(checkpoint, tmp_path):
    """`vllm.LLM(folder)` (through the vLLM engine) on the exported folder: same greedy tokens as HF."""
    from rllib_dph.engines.base import SamplingParams
    from rllib_dph.engines.hf import HFEngine
    from rllib_dph.engines.vllm import VLLMEngine

    out = tmp_path / "hf"
    main(["export", str(checkpoint), str(out)])
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": text}]) for text in ("SELECT 1", "2+2?")]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    vllm_engine = VLLMEngine.from_pretrained(str(out), dtype="float32", max_model_len=256,
                                             kv_cache_memory_bytes=64 << 20)
    hf_groups = HFEngine.from_pretrained(str(out), dtype="float32").generate(prompts, params)
    for hf_group, vllm_group in zip(hf_groups, vllm_engine.generate(prompts, params)):
        assert list(vllm_group[0].token_ids) == list(hf_group[0].token_ids)
