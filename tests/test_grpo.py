"""GRPO end to end: config validation, env runner batches, learner updates, checkpoints, CLI."""

import json
import os
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_dph import columns as C

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"group_size": 1}, "group_size=1 is invalid: it must be an int >= 2"),
        ({"group_size": 2.5}, "group_size=2.5 is invalid: it must be an int >= 2"),
        ({"group_size": "8"}, "group_size='8' (str) is invalid: it must be an int >= 2"),
        ({"group_size": True}, "group_size=True (bool) is invalid"),
        ({"lr": math.nan}, "lr=nan is invalid: it must be a finite number > 0"),
        ({"lr": -1e-5}, "lr=-1e-05 is invalid: it must be a finite number > 0"),
        ({"lr": math.inf}, "lr=inf is invalid"),
        ({"grad_clip": -1}, "grad_clip=-1 is invalid: it must be None or a finite number > 0"),
        ({"num_epochs": 0}, "num_epochs=0 is invalid: it must be an int >= 1"),
        ({"temperature": 0.0}, "temperature=0.0 is invalid: it must be a finite number > 0"),
        ({"temperature": math.nan}, "temperature=nan is invalid"),
        ({"top_p": 1.5}, "top_p=1.5 is invalid: it must be a finite number in (0, 1]"),
        ({"top_p": math.nan}, "top_p=nan is invalid"),
        ({"kl_coeff": math.nan}, "kl_coeff=nan is invalid: it must be a finite number >= 0"),
        ({"entropy_coeff": -0.1}, "entropy_coeff=-0.1 is invalid"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c=1.0 is invalid: it must be None or a finite number > 1"),
        ({"trust_region": {"truncation": 0}}, "trust_region['truncation']=0 is invalid: it must be None or a number > 0 (math.inf allowed)"),
        ({"trust_region": {"kind": "dppo_binary_tv", "high": 5}}, "trust_region['high']=5 is invalid: it must be None or a finite number in (0, 1)"),
        ({"trust_region": {"kind": "dppo_binary_kl", "low": math.inf}}, "trust_region['low']=inf is invalid"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode='sum' is not one of"),
        ({"trust_region": "dppo_topk_tv", "rollout_top_k": 0}, "needs the rollout engine's top-K"),
        ({"trust_region": {"low": 1.0}}, "trust_region['low']=1.0 is invalid: it must be None or a finite number in [0, 1)"),
        ({"trust_region": {"kind": "ppo", "hi": 0.3}}, "has no key 'hi'; its keys are ['kind', 'low', 'high', 'truncation', 'anchor']"),
        ({"trust_region": {"anchor": "pi_old"}}, "trust_region['anchor']='pi_old' is not one of ['behavior', 'recompute']"),
        ({"kl_estimator": "k4"}, "kl_estimator='k4' is not one of"),
        ({"minibatch_size": 1000}, "minibatch_size=1000 must be a multiple of group_size=4"),
        ({"minibatch_size": 6}, "minibatch_size=6 must be a multiple of group_size=4"),
        ({"overlong_buffer_length": 500}, "overlong_buffer_length=500 must be < max_response_length=16"),
        ({"engine": "sglang"}, "engine='sglang' is not one of"),
        ({"engine": "vllm", "top_p": 0.9}, "engine='vllm' with top_p=0.9"),
        ({"dtype": "float16"}, "dtype='float16' would train the learner under fp16 autocast"),
        ({"max_consecutive_skipped_updates": 0}, "max_consecutive_skipped_updates=0 is invalid"),
        ({"trust_region": "gspo"}, "trust_region kind='gspo' is not one of"),
        ({"trust_region": {"kind": "tis", "truncation": math.inf}}, "trust_region kind 'tis' weights every token by min(π_θ/μ, C), but trust_region['truncation']=inf; set it to 2.0"),
        ({"trust_region": {"kind": "cispo", "truncation": math.inf}}, "set it to 3.0"),
        ({"trust_region": {"kind": "tis", "high": 0.28}}, "trust_region['high']=0.28 is invalid: this trust region has no such threshold"),
        ({"trust_region": {"kind": "icepop", "low": 1.5}}, "trust_region['low']=1.5 is invalid: it must be None or a finite number in (0, 1]"),
        ({"trust_region": {"kind": "icepop", "high": 0.5}}, "trust_region['high']=0.5 is invalid: it must be None or a finite number >= 1"),
        ({"trust_region": {"kind": "ipo", "low": 1.0}}, "trust_region['low']=1.0 is invalid: it must be None or a finite number in (0, 1)"),
        ({"trust_region": {"kind": "opsm", "low": 0}}, "trust_region['low']=0 is invalid: it must be None or a finite number > 0"),
        ({"trust_region": {"kind": "opsm", "high": 0.1}}, "trust_region['high']=0.1 is invalid: this trust region has no such threshold"),
    ],
)
def test_validate_names_value_rule_and_fix(tiny_grpo_config, overrides, message):
    config = tiny_grpo_config.copy(copy_frozen=False)
    config.update_from_dict(overrides)
    with pytest.raises(ValueError) as err:
        config.validate()
    assert message in str(err.value)


def _bounds(config):
    region = config.trust_region_setting
    return region.low, region.high


def test_defaults_validate(tiny_grpo_config):
    tiny_grpo_config.validate()
    assert _bounds(tiny_grpo_config) == (0.2, 0.2)
    assert tiny_grpo_config.trust_region_setting.truncation == math.inf
    dppo = tiny_grpo_config.copy(copy_frozen=False).training(trust_region="dppo_binary_tv")
    assert _bounds(dppo) == (0.15, 0.15)


@pytest.mark.parametrize(
    "trust_region, bounds",
    [
        ("ppo", (0.2, 0.2)),
        ("icepop", (0.5, 5.0)),
        ("ipo", (0.3, 0.3)),
        ("opsm", (1e-4, None)),
        ("dppo_binary_kl", (0.05, 0.05)),
        ("tis", (None, None)),
    ],
)
def test_thresholds_default_to_the_specs(tiny_grpo_config, trust_region, bounds):
    config = tiny_grpo_config.copy(copy_frozen=False).training(trust_region=trust_region)
    config.validate()
    assert _bounds(config) == bounds
    if bounds[0] is not None:
        config.training(trust_region={"kind": trust_region, "low": 0.25})
        config.validate()
        assert _bounds(config) == (0.25, bounds[1])


@pytest.mark.parametrize("kind, truncation", [("tis", 2.0), ("cispo", 3.0), ("ppo", math.inf)])
def test_truncation_defaults_to_the_specs_c(tiny_grpo_config, kind, truncation):
    config = tiny_grpo_config.copy(copy_frozen=False).training(trust_region=kind)
    config.validate()
    assert config.trust_region_setting.truncation == truncation
    config.training(trust_region={"kind": kind, "truncation": 5.0})
    assert config.trust_region_setting.truncation == 5.0


def test_a_dict_replaces_the_whole_trust_region_setting(tiny_grpo_config):
    config = tiny_grpo_config.copy(copy_frozen=False).training(trust_region={"kind": "ppo", "high": 0.28})
    assert _bounds(config) == (0.2, 0.28)
    config.training(trust_region={"kind": "dppo_binary_tv"})
    assert _bounds(config) == (0.15, 0.15)


def test_verls_clip_name_is_refused_with_the_trust_region_setting(tiny_grpo_config):
    with pytest.raises(TypeError, match=r"'clip_ratio_high' \(did you mean 'trust_region'\? verl's ε_high: "
                                        r"trust_region=\{'kind': 'ppo', 'high': \.\.\.\}"):
        tiny_grpo_config.copy(copy_frozen=False).training(clip_ratio_high=0.28)


@pytest.fixture
def env_runner(tiny_grpo_config):
    from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner

    return LLMEnvRunner(config=tiny_grpo_config.copy(copy_frozen=False).training(rollout_top_k=3))


def test_env_runner_batch_layout(env_runner):
    batch = env_runner.sample(num_prompts=3)
    rows = 3 * 4
    b, length = batch[C.INPUT_IDS].shape
    assert b == rows
    for key in (C.ATTENTION_MASK, C.RESPONSE_MASK, C.BEHAVIOR_LOGP):
        assert batch[key].shape == (rows, length)
    assert batch[C.TOPK_IDS].shape == (rows, length, 3)
    for key in (C.REWARDS, C.CORRECT, C.TRUNCATED, C.GROUP_IDS, C.ROW_TYPE):
        assert batch[key].shape == (rows,)
    # Each group of 4 rows shares a prompt and a group id; groups differ.
    assert len(np.unique(batch[C.GROUP_IDS])) == 3
    for i in range(rows):
        p, r = batch[C.PROMPT_LENGTH][i], batch[C.RESPONSE_LENGTH][i]
        assert batch[C.ATTENTION_MASK][i].sum() == p + r
        assert batch[C.RESPONSE_MASK][i, p : p + r].all() and batch[C.RESPONSE_MASK][i].sum() == r
        assert (batch[C.BEHAVIOR_LOGP][i, p : p + r] <= 0).all()
        assert (batch[C.BEHAVIOR_LOGP][i, : p] == 0).all()
        group = batch[C.GROUP_IDS] == batch[C.GROUP_IDS][i]
        np.testing.assert_array_equal(batch[C.INPUT_IDS][group][:, :p], batch[C.INPUT_IDS][i : i + 1, :p].repeat(4, 0))
    assert (batch[C.ROW_TYPE] == C.ROW_TYPE_EXP).all()
    assert set(np.unique(batch[C.REWARDS])) <= {0.0, 1.0}
    # Group ids never repeat across calls.
    assert not set(env_runner.sample(num_prompts=3)[C.GROUP_IDS]) & set(batch[C.GROUP_IDS])
    metrics = env_runner.get_metrics()
    for key in ("reward_mean", "accuracy", "response_length_mean", "truncation_rate", "generation_tokens_per_s"):
        assert key in metrics


def _learner_batch(config, env_runner):
    from rllib_dph.losses.advantages import group_advantages

    batch = env_runner.sample(num_prompts=2)
    # Random rewards so that advantages are non-zero.
    batch[C.REWARDS] = np.random.default_rng(0).integers(0, 2, len(batch[C.REWARDS])).astype(np.float32)
    batch[C.ADVANTAGES] = group_advantages(
        torch.as_tensor(batch[C.REWARDS]), torch.as_tensor(batch[C.GROUP_IDS])
    ).numpy()
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=len(batch[C.REWARDS]))


@pytest.mark.parametrize("trust_region", ["ppo", "dppo_binary_tv", "dppo_topk_kl"])
def test_learner_update_changes_parameters_and_logs_every_term(tiny_grpo_config, env_runner, trust_region):
    config = tiny_grpo_config.copy(copy_frozen=False).training(
        trust_region=trust_region, rollout_top_k=3, kl_coeff=0.1
    )
    learner = config.build_learner(env=env_runner.env)
    batch = _learner_batch(config, env_runner)
    before = {k: v.clone() for k, v in learner.module[DEFAULT_MODULE_ID].model.state_dict().items()}
    results = learner.update(batch=batch, num_epochs=1, minibatch_size=8)
    after = learner.module[DEFAULT_MODULE_ID].model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    logged = results[DEFAULT_MODULE_ID]
    for key in (
        "policy_loss", "kl_loss", "entropy", "total_loss", "clip_fraction", "clip_fraction_pos_adv",
        "clip_fraction_neg_adv", "abs_prob_diff_mean", "abs_prob_diff_max", "bad_update_fraction",
        "approx_kl_to_behavior", "num_exploration_tokens", "gradients_default_optimizer_global_norm",
        "dual_clip_fraction", "skipped_updates", "consecutive_skipped_updates",
    ):
        assert key in logged, key
    assert ("trust_region_divergence_mean" in logged) == (trust_region != "ppo")
    assert learner.ref_model is not None


@pytest.mark.parametrize(
    "trust_region",
    [
        "tis",
        "cispo",
        "icepop",
        "ipo",
        "opsm",
    ],
)
def test_learner_update_with_each_correction_is_finite_and_logs_its_masked_fraction(
    tiny_grpo_config, env_runner, trust_region
):
    config = tiny_grpo_config.copy(copy_frozen=False).training(trust_region=trust_region)
    config.validate()
    learner = config.build_learner(env=env_runner.env)
    logged = learner.update(batch=_learner_batch(config, env_runner), num_epochs=2, minibatch_size=8)[DEFAULT_MODULE_ID]
    for key in ("policy_loss", "total_loss"):
        assert math.isfinite(logged[key].peek()), key
    assert 0.0 <= logged["clip_fraction"].peek() <= 1.0


def test_recompute_anchor_ablation(tiny_grpo_config, env_runner):
    """The "recompute" anchor adds π_old log-probs; mismatch metrics still compare with μ."""
    config = tiny_grpo_config.copy(copy_frozen=False).training(
        trust_region={"kind": "dppo_topk_tv", "anchor": "recompute"}, rollout_top_k=3
    )
    learner = config.build_learner(env=env_runner.env)
    batch = _learner_batch(config, env_runner)
    logged = learner.update(batch=batch, num_epochs=2, minibatch_size=8)[DEFAULT_MODULE_ID]
    module_batch = batch.policy_batches[DEFAULT_MODULE_ID]
    assert C.ANCHOR_LOGP in module_batch and C.TOPK_ANCHOR_LOGP in module_batch
    mask = module_batch[C.RESPONSE_MASK].astype(bool)
    np.testing.assert_allclose(module_batch[C.ANCHOR_LOGP][mask], module_batch[C.BEHAVIOR_LOGP][mask], atol=1e-4)
    assert logged["abs_prob_diff_mean"].peek() > 0  # π moved away from μ during epoch 2


def test_no_reference_model_without_kl(tiny_grpo_config, env_runner):
    learner = tiny_grpo_config.build_learner(env=env_runner.env)
    assert learner.ref_model is None


def test_first_epoch_is_on_policy(tiny_grpo_config, env_runner):
    """Before any update, π_θ on the learner equals μ from the engine: ratio 1, nothing clipped."""
    learner = tiny_grpo_config.build_learner(env=env_runner.env)
    results = learner.update(batch=_learner_batch(tiny_grpo_config, env_runner), num_epochs=1, minibatch_size=8)
    logged = results[DEFAULT_MODULE_ID]
    assert logged["clip_fraction"].peek() == 0.0
    assert logged["abs_prob_diff_max"].peek() < 1e-4


def test_bfloat16_learner_keeps_fp32_master_weights_and_moves_every_tensor(tiny_grpo_config, env_runner):
    """Mixed precision: at lr 1e-5 every parameter tensor moves, norm weights at 1.0 included
    (bf16 weights would round such steps away), and weights and Adam state stay float32. The
    recompute anchor and the reference model run through the same autocast: KL 0 at the start."""
    config = tiny_grpo_config.copy(copy_frozen=False).llm(dtype="bfloat16").training(
        lr=1e-5, kl_coeff=0.1, trust_region={"anchor": "recompute"}
    )
    learner = config.build_learner(env=env_runner.env)
    model = learner.module[DEFAULT_MODULE_ID].model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logged = learner.update(batch=_learner_batch(config, env_runner), num_epochs=1, minibatch_size=8)
    after = model.state_dict()
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, unchanged
    assert any("norm" in k for k in before)
    assert {v.dtype for v in after.values()} == {torch.float32}
    optim_state = learner.get_optimizer().state.values()
    assert {t.dtype for s in optim_state for k, t in s.items() if k != "step"} == {torch.float32}
    assert learner.ref_model.dtype == torch.float32
    assert logged[DEFAULT_MODULE_ID]["kl_loss"].peek() == 0.0


def test_bfloat16_learner_state_round_trips_through_save_and_restore(tiny_grpo_config, env_runner, tmp_path):
    """The learner's full state (module and Adam state) goes through numpy, which has no bf16."""
    config = tiny_grpo_config.copy(copy_frozen=False).llm(dtype="bfloat16")
    learner = config.build_learner(env=env_runner.env)
    learner.update(batch=_learner_batch(config, env_runner), num_epochs=1, minibatch_size=8)
    state = learner.get_state()
    learner.save_to_path(str(tmp_path))

    restored = config.build_learner(env=env_runner.env)
    restored.restore_from_path(str(tmp_path))
    new_state = restored.get_state()
    for k, v in state["rl_module"][DEFAULT_MODULE_ID].items():
        assert torch.equal(new_state["rl_module"][DEFAULT_MODULE_ID][k], v), k
    assert str(new_state["optimizer"]) == str(state["optimizer"])


def test_bfloat16_autocast_logprobs_match_the_fp32_forward(tiny_grpo_config, env_runner):
    """The same fp32 weights give float32 log-probs under bf16 autocast, within bf16 rounding."""
    from rllib_dph.policy.rl_module import LOGP

    batch = env_runner.sample(num_prompts=2)
    inputs = {k: torch.as_tensor(batch[k]) for k in (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)}
    mask = torch.as_tensor(batch[C.RESPONSE_MASK]).bool()
    logp = {}
    for dtype in ("float32", "bfloat16"):
        config = tiny_grpo_config.copy(copy_frozen=False).llm(dtype=dtype)
        spec = config.get_default_rl_module_spec()
        spec.observation_space, spec.action_space = env_runner.env.observation_space, env_runner.env.action_space
        module = spec.build()
        assert next(module.model.parameters()).dtype == torch.float32
        with torch.no_grad():
            logp[dtype] = module.forward_train(inputs)[LOGP]  # (B, L)
        assert logp[dtype].dtype == torch.float32
    gap = (logp["bfloat16"] - logp["float32"])[mask].abs()
    assert 0 < gap.max() < 0.05  # autocast is on, and bf16 keeps ~3 significant digits


def test_train_save_restore_and_resume(ray_session, tiny_grpo_config, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    algo = tiny_grpo_config.build_algo()
    r1 = algo.train()
    assert r1["training_iteration"] == 1
    assert "reward_mean" in r1["env_runners"] and "policy_loss" in r1["learners"][DEFAULT_MODULE_ID]
    algo.save_to_path(str(tmp_path))
    weights = algo.learner_group.get_state()["learner"]["rl_module"][DEFAULT_MODULE_ID]
    optim = algo.learner_group.get_state()["learner"]["optimizer"]
    algo.stop()

    restored = Algorithm.from_checkpoint(str(tmp_path))
    state = restored.learner_group.get_state()["learner"]
    for k, v in weights.items():
        torch.testing.assert_close(torch.as_tensor(state["rl_module"][DEFAULT_MODULE_ID][k]), torch.as_tensor(v))
    assert str(state["optimizer"]) == str(optim)
    r2 = restored.train()
    assert r2["training_iteration"] == 2
    restored.stop()


def test_dynamic_sampling_keeps_only_groups_with_signal(ray_session, tiny_grpo_config):
    config = tiny_grpo_config.copy(copy_frozen=False).training(dynamic_sampling=True, max_dynamic_sampling_rounds=2)
    algo = config.build_algo()
    batch = algo.sample_groups()
    for g in np.unique(batch[C.GROUP_IDS]):
        rewards = batch[C.REWARDS][batch[C.GROUP_IDS] == g]
        if len(np.unique(batch[C.REWARDS])) > 1:
            assert len(np.unique(rewards)) > 1
    assert len(np.unique(batch[C.GROUP_IDS])) <= config.prompts_per_step
    algo.stop()


def test_rllib_train_file_smoke(tmp_path):
    """`rllib train file` on the tuned example, two iterations, through Tune."""
    overrides = {
        "model_name": "tiny-random",
        "max_response_length": 16,
        "group_size": 2,
        "prompts_per_step": 2,
        "minibatch_size": None,
    }
    cmd = [
        sys.executable, "-m", "rllib_dph.cli", "train", "file",
        str(REPO / "tuned_examples/grpo/sql_tiny_grpo.py"),
        "--stop", json.dumps({"training_iteration": 2}),
        "--config", json.dumps(overrides),
        "--storage-path", str(tmp_path), "--name", "smoke", "--checkpoint-at-end", "-v", "0",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "training_iteration=2" in out.stdout
    trial_dirs = [p for p in (tmp_path / "smoke").iterdir() if p.is_dir()]
    assert trial_dirs
    assert list(trial_dirs[0].glob("checkpoint_*"))
    assert list(trial_dirs[0].glob("events.out.tfevents*"))
    assert (trial_dirs[0] / "result.json").read_text().strip()


def test_two_ddp_learners(ray_session, tiny_grpo_config):
    """num_learners=2 runs DDP over gloo on CPU; both learners hold the same weights after a step."""
    config = (
        tiny_grpo_config.copy(copy_frozen=False)
        .learners(num_learners=2, num_cpus_per_learner=0.5)
    )
    algo = config.build_algo()
    result = algo.train()
    assert result["training_iteration"] == 1
    states = algo.learner_group.foreach_learner(
        lambda learner: {k: v.sum().item() for k, v in learner.module[DEFAULT_MODULE_ID].unwrapped().model.state_dict().items()}
    )
    w0, w1 = [s.get() if hasattr(s, "get") else s for s in states]
    for k in w0:
        assert math.isclose(w0[k], w1[k], rel_tol=1e-5, abs_tol=1e-5)
    algo.stop()


def test_two_remote_env_runners_sample_and_receive_weights(ray_session, tiny_grpo_config):
    """Remote env runners split the prompts and get the learner's weights after each update."""
    config = tiny_grpo_config.copy(copy_frozen=False).env_runners(
        num_env_runners=2, num_cpus_per_env_runner=0.5
    ).training(prompts_per_step=3)
    algo = config.build_algo()
    result = algo.train()
    assert result["env_runners"]["num_env_steps_sampled"] == 3 * config.group_size
    learner_w = algo.learner_group.get_state()["learner"]["rl_module"][DEFAULT_MODULE_ID]
    key = next(iter(learner_w))
    runner_w = algo.env_runner_group.foreach_env_runner(
        lambda r: r.engine.model.state_dict()[key].sum().item(), local_env_runner=False
    )
    assert all(math.isclose(w, float(learner_w[key].sum()), rel_tol=1e-5, abs_tol=1e-5) for w in runner_w)
    algo.stop()


def test_validation_during_training_reports_pass_at_k(ray_session, tiny_grpo_config):
    config = tiny_grpo_config.copy(copy_frozen=False).held_out(
        val_interval=2, val_env_config={"data": "sql_synth/test_cross"}, val_n=2, val_limit=3
    )
    algo = config.build_algo()
    assert "evaluation" not in algo.train()
    result = algo.train()
    for key in ("pass@1", "pass@2", "greedy_accuracy"):
        assert 0.0 <= result["evaluation"][key] <= 1.0
    algo.stop()


@pytest.mark.slow
def test_rllib_train_resumes_an_interrupted_experiment(tmp_path):
    """Kill `rllib train` after its first checkpoint; `--resume` continues to the stop criterion."""
    import signal
    import time

    STOP = 60  # iterations take ~0.3 s: room to kill the run before it ends, also on a busy machine

    args = [
        sys.executable, "-m", "rllib_dph.cli", "train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0",
        "--config", json.dumps({
            "model_name": "tiny-random", "max_response_length": 16, "group_size": 2,
            "prompts_per_step": 2, "env_config": {"data": "sql_synth/test"},
        }),
        "--stop", json.dumps({"training_iteration": STOP}), "--checkpoint-freq", "1",
        "--storage-path", str(tmp_path), "--name", "resumable", "-v", "0",
    ]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 300

    def first_iteration_saved():
        trials = list(tmp_path.glob("resumable/GRPO_*"))
        return trials and (trials[0] / "checkpoint_000000").is_dir() and (trials[0] / "result.json").is_file() \
            and (trials[0] / "result.json").read_text().strip()

    while not first_iteration_saved() and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    trial = next((tmp_path / "resumable").glob("GRPO_*"))
    done_before = len((trial / "result.json").read_text().splitlines())
    assert done_before < STOP

    out = subprocess.run(args + ["--resume"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"training_iteration={STOP}" in out.stdout
    lines = (trial / "result.json").read_text().splitlines()
    # SIGKILL may cut the line being written at that moment (the last one before the resume).
    cut = [i for i, line in enumerate(lines) if not _is_json(line)]
    assert cut in ([], [done_before - 1]), f"unreadable result lines {cut}; killed after line {done_before}"
    iterations = [json.loads(line)["training_iteration"] for i, line in enumerate(lines) if i not in cut]
    assert iterations[-1] == STOP and iterations[done_before - len(cut)] > 1  # continued, not restarted


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True
