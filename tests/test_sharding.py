"""FSDP2 sharded learners on CPU (gloo): the step of one learner, half the bytes each, full-state
checkpoints, the weight sync to the rollout engine, and ``rllib train`` with ``sharding="fsdp2"``;
with LoRA, the same on 2 FSDP2 and on 2 DDP learners (adapters only) and checkpoints that cross
between sharded and 1-learner groups."""

import subprocess
import sys

import numpy as np
import pytest
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_dph.policy import lora
from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.learners.splits import shard_groups
from rllib_dph.models.hub import load_causal_lm
from rllib_dph.learners.sharding import held_bytes

from extras import needs_peft
from test_dph import TOY_ENV, envs_make  # registers the toy env
from test_update_correctness import GROUP, _exploration_batch, _wrap

SHARDED = {"num_learners": 2, "num_cpus_per_learner": 0.5}
LORA = {"r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}


def _config(**training):
    return (
        GRPOConfig()
        .environment(TOY_ENV)
        .llm(model_name="tiny-random", max_response_length=12)
        .training(group_size=GROUP, prompts_per_step=3, lr=1e-4, grad_clip=0.5, **training)
        .debugging(seed=0)
    )


def _sharded_group(config):
    return config.copy(copy_frozen=False).learners(sharding="fsdp2", **SHARDED).build_learner_group(env=envs_make())


def _full_state(group):
    """Model and optimizer state gathered from the learners' shards (``ShardedLearnerGroup``)."""
    state = group.get_state()["learner"]
    optim = next(iter(state["optimizer"].values()))["state"]
    return {k: torch.as_tensor(v) for k, v in state["rl_module"][DEFAULT_MODULE_ID].items()}, optim


@pytest.mark.parametrize(
    "training",
    [
        {},
        # Unequal micro-batch counts on the two learners (padded), and a sharded π_ref.
        {"max_tokens_per_microbatch": 40, "kl_coeff": 0.5, "trust_region": {"anchor": "recompute"}},
    ],
    ids=["one-pass", "microbatches+kl+recompute"],
)
def test_fsdp2_learners_take_the_step_of_one(ray_session, tmp_path, training):
    """2 FSDP2 learners on shards of the batch = 1 learner on all of it; each holds half the
    parameter and optimizer bytes; a checkpoint of the shards restores the gathered state."""
    config = _config(**training)
    batch = _exploration_batch(config, num_prompts=3)  # 3 groups: shards of 2 and 1 groups
    local = config.build_learner(env=envs_make())
    local.update(batch=_wrap(batch))
    expected = {k: v.detach() for k, v in local.module[DEFAULT_MODULE_ID].model.state_dict().items()}
    alone = held_bytes(local)

    group = _sharded_group(config)
    try:
        group.update(batches=[_wrap(shard) for shard in shard_groups(batch, 2)], num_minibatches=1)
        weights, optim = _full_state(group)
        for name, value in expected.items():
            torch.testing.assert_close(weights[name], value, atol=1e-5, rtol=0)
        assert any(not torch.equal(value, torch.as_tensor(_config().build_learner(env=envs_make()).module[DEFAULT_MODULE_ID].model.state_dict()[name])) for name, value in expected.items())

        for held in [r.get() for r in group.foreach_learner(held_bytes)]:
            for kind in ("parameters", "gradients", "optimizer"):  # half of each, up to padding
                assert 0.45 < held[kind] / alone[kind] < 0.55, (kind, held, alone)

        group.save_to_path(tmp_path / "ckpt")
        group.update(batches=[_wrap(shard) for shard in shard_groups(batch, 2)], num_minibatches=1)
        moved, _ = _full_state(group)
        assert any(not torch.equal(moved[k], weights[k]) for k in weights)
        group.restore_from_path(tmp_path / "ckpt")
        restored, restored_optim = _full_state(group)
        for name, value in weights.items():
            torch.testing.assert_close(restored[name], value, atol=0, rtol=0)
        assert set(restored_optim["state"]) == set(optim["state"]) and optim["state"]
        for name, moments in optim["state"].items():
            for key, value in moments.items():
                np.testing.assert_array_equal(restored_optim["state"][name][key], value)
    finally:
        group.shutdown()


def test_fsdp2_needs_two_learners_and_global_norm():
    with pytest.raises(ValueError, match=r"sharding='fsdp2'.*num_learners=0"):
        _config().learners(sharding="fsdp2").validate()
    with pytest.raises(ValueError, match=r"grad_clip_by='norm'"):
        _config().learners(sharding="fsdp2", **SHARDED).training(grad_clip_by="norm").validate()
    with pytest.raises(ValueError, match=r"sharding='zero3' is not one of"):
        _config().learners(sharding="zero3").validate()


@pytest.mark.parametrize("sharding", ["ddp", "fsdp2"])
def test_gpu_learners_do_not_share_a_gpu(sharding):
    """Two NCCL ranks on one GPU fail at the first collective ('Duplicate GPU detected'): the
    config refuses fractional GPUs for several learners."""
    with pytest.raises(ValueError, match=r"num_gpus_per_learner=0.5 with num_learners=2 .*whole GPU"):
        _config().learners(sharding=sharding, num_learners=2, num_gpus_per_learner=0.5).validate()
    _config().learners(sharding=sharding, num_learners=2, num_gpus_per_learner=1).validate()
    _config().learners(num_learners=1, num_gpus_per_learner=0.5).validate()


@pytest.mark.parametrize("lora_settings", [None, pytest.param(LORA, marks=needs_peft)], ids=["full", "lora"])
def test_fsdp2_algorithm_syncs_full_weights_and_restores(ray_session, tmp_path, lora_settings):
    """After a training step the rollout engine holds the gathered full weights (with LoRA: the
    gathered adapters, its base untouched); an algorithm checkpoint restores them."""
    config = _config().training(prompts_per_step=2).llm(lora=lora_settings).learners(sharding="fsdp2", **SHARDED)
    algo = config.build_algo()
    try:
        algo.train()
        tensors = lambda state: {k: v for k, v in state.items() if k != lora.LORA_SETTINGS}  # noqa: E731
        learner_state = tensors(algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID])
        engine_state = algo.env_runner.engine.model.state_dict()
        assert set(learner_state) == set(engine_state if lora_settings is None else lora.adapter_tensors(engine_state))
        for name, value in learner_state.items():
            torch.testing.assert_close(engine_state[name].float(), torch.as_tensor(value), atol=0, rtol=0)
        if lora_settings is not None:  # the engine's base weights stay those of the base model
            base = load_causal_lm("tiny-random", dtype=torch.float32).state_dict()
            for name, value in engine_state.items():
                if not lora.is_adapter_key(name):
                    torch.testing.assert_close(value.float(), base[name.replace(".base_layer.", ".")], atol=0, rtol=0)
        algo.save_to_path(tmp_path / "algo")
        algo.train()
        algo.restore_from_path(tmp_path / "algo")
        restored = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
        for name, value in learner_state.items():
            torch.testing.assert_close(torch.as_tensor(restored[name]), torch.as_tensor(value), atol=0, rtol=0)
    finally:
        algo.stop()


@pytest.mark.slow
def test_rllib_train_with_fsdp2_learners(tmp_path):
    """The command line of docs/scaling.md with two FSDP2 learners, two iterations."""
    overrides = (
        '{"num_learners": 2, "num_cpus_per_learner": 0.5, "sharding": "fsdp2", '
        '"model_name": "tiny-random", "prompts_per_step": 2, "group_size": 4, "max_response_length": 16}'
    )
    out = subprocess.run(
        [
            sys.executable, "-m", "rllib_dph.cli", "train", "file", "tuned_examples/grpo/sql_tiny_grpo.py",
            "--config", overrides, "--stop", '{"training_iteration": 2}',
            "--storage-path", str(tmp_path), "--name", "fsdp2",
        ],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "training_iteration=2" in out.stdout


def test_gradient_checkpointing_takes_the_same_step():
    """``gradient_checkpointing=True`` recomputes activations and changes nothing else."""
    config = _config()
    batch = _exploration_batch(config, num_prompts=2)
    states = []
    for checkpointing in (False, True):
        learner = config.copy(copy_frozen=False).llm(gradient_checkpointing=checkpointing).build_learner(env=envs_make())
        assert learner.module[DEFAULT_MODULE_ID].model.is_activation_checkpointing == checkpointing
        learner.update(batch=_wrap(batch))
        states.append(learner.module[DEFAULT_MODULE_ID].model.state_dict())
    # Without checkpointing the forward runs each shared prompt once (``rl_module.shared_prompt_hidden``),
    # with it the full pass: the same step up to float summation order, which Adam's normalised
    # step can carry into the weights at ~1e-6.
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------- LoRA


def _lora_view(learner):  # runs on the learners: pickled by value (see below)
    """One learner's LoRA facts: its full model state (gathered from the shards under FSDP2: a
    collective, so every learner runs it; {} off rank 0), the names of the parameters its
    optimizer holds and of those with Adam state, and its held bytes."""
    from rllib_dph.policy.full_state import full_model_state, is_sharded

    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    model = module.model
    names = {id(p): n for n, p in model.named_parameters()}
    optim = learner.get_optimizer()
    view = {
        "optimized": sorted(names[id(p)] for g in optim.param_groups for p in g["params"]),
        "with_state": sorted(names[id(p)] for p in optim.state),
        "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad),
        "held": held_bytes(learner),
    }
    state = full_model_state(model) if is_sharded(module.response_lm) else model.state_dict()
    view["model"] = {k: v.detach().cpu().clone() for k, v in state.items()}
    view["adapters"] = sorted(k for k in view["model"] if lora.is_adapter_key(k))
    return view


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the learners cannot import tests/


def _lora_checkpoints_cross(config, group, synced, optim, tmp_path):
    """The sharded LoRA group's checkpoint restores into 1 learner (adapters and Adam state by
    name), and that learner's checkpoint (torch's positional optimizer state) into the shards."""
    group.save_to_path(tmp_path / "sharded")
    one = config.build_learner_group(env=envs_make())  # 1 (local) learner
    try:
        one.restore_from_path(tmp_path / "sharded")
        model = one._learner.module[DEFAULT_MODULE_ID].model
        for name, value in lora.adapter_tensors(model.state_dict()).items():
            torch.testing.assert_close(value, torch.as_tensor(synced[name]), atol=0, rtol=0)
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        positional = one._learner.get_optimizer().state_dict()["state"]
        assert len(positional) == len(names) == len(optim["state"])
        for index, name in enumerate(names):
            for key, value in optim["state"][name].items():
                np.testing.assert_array_equal(positional[index][key].numpy(), value)
        one.save_to_path(tmp_path / "one")
    finally:
        one.shutdown()
    group.restore_from_path(tmp_path / "one")
    state = group.get_state()["learner"]
    for name, value in synced.items():
        if name != lora.LORA_SETTINGS:
            torch.testing.assert_close(torch.as_tensor(state["rl_module"][DEFAULT_MODULE_ID][name]), torch.as_tensor(value), atol=0, rtol=0)
    back = next(iter(state["optimizer"].values()))["state"]["state"]
    for name, moments in optim["state"].items():
        for key, value in moments.items():
            np.testing.assert_array_equal(back[name][key], value)


def _lora_step_of_one():
    """The LoRA config (KL to the base, activation checkpointing), a batch of 3 groups, and one
    local learner's views before and after its update on all of it: the step 2 learners must take."""
    config = _config(kl_coeff=0.5).llm(lora=dict(LORA), gradient_checkpointing=True)
    batch = _exploration_batch(config, num_prompts=3)
    local = config.build_learner(env=envs_make())
    before = _lora_view(local)
    local.update(batch=_wrap(batch))
    return config, batch, local, before, _lora_view(local)


@needs_peft
def test_fsdp2_lora_learners_take_the_step_of_one(ray_session, tmp_path):
    """2 FSDP2 learners with LoRA (and activation checkpointing) on shards of the batch = 1 LoRA
    learner on all of it: the same adapters after the step, the base untouched, Adam state for
    each learner's adapter shards only, a weight sync of adapter tensors alone, and checkpoints
    that cross between the sharded group and 1 learner both ways."""
    # kl_coeff: π_ref is the sharded base with its adapters switched off.
    config, batch, local, before, alone = _lora_step_of_one()
    sync = local.module[DEFAULT_MODULE_ID].get_state()  # what the 1-learner weight sync sends

    group = _sharded_group(config)
    try:
        group.update(batches=[_wrap(shard) for shard in shard_groups(batch, 2)], num_minibatches=1)
        views = [r.get() for r in group.foreach_learner(_lora_view)]
        gathered = next(v["model"] for v in views if v["model"])  # rank 0's full state
        assert set(gathered) == set(alone["model"])
        for name, value in alone["model"].items():
            # Adam's first step moves each adapter weight by ~lr = 1e-4 (B leaves 0 by that);
            # summing the gradient in two shards instead of one changes it by ~2e-7 (float rounding).
            torch.testing.assert_close(gathered[name], value, atol=1e-6, rtol=0)
            if not lora.is_adapter_key(name):
                assert torch.equal(gathered[name], before["model"][name]), name  # the base stays frozen
        assert any(".lora_B." in k and gathered[k].abs().max() > 1e-5 for k in gathered)  # B left 0
        for view in views:
            assert view["optimized"] == view["with_state"] == view["trainable"] == alone["adapters"]
            assert 0.45 < view["held"]["optimizer"] / alone["held"]["optimizer"] < 0.55  # a shard each

        state = group.get_state()["learner"]  # what `sync_weights` sends the env runners
        synced = state["rl_module"][DEFAULT_MODULE_ID]
        assert synced[lora.LORA_SETTINGS] == sync[lora.LORA_SETTINGS]
        assert {k: tuple(v.shape) for k, v in synced.items() if k != lora.LORA_SETTINGS} == {
            k: tuple(v.shape) for k, v in sync.items() if k != lora.LORA_SETTINGS
        }
        optim = next(iter(state["optimizer"].values()))["state"]
        assert sorted(optim["state"]) == alone["adapters"]  # Adam state of the adapters, by name
        _lora_checkpoints_cross(config, group, synced, optim, tmp_path)
    finally:
        group.shutdown()


@needs_peft
def test_ddp_lora_learners_take_the_step_of_one(ray_session):
    """2 DDP learners with LoRA and activation checkpointing = 1 learner on the whole batch: DDP
    wraps the peft-injected model, all-reduces the adapter gradients alone (the frozen base has
    none) and every replica takes the 1-learner step; the sync sends adapters only."""
    config, batch, _, before, alone = _lora_step_of_one()

    group = config.copy(copy_frozen=False).learners(**SHARDED).build_learner_group(env=envs_make())
    try:
        group.update(batches=[_wrap(shard) for shard in shard_groups(batch, 2)], num_minibatches=1)
        views = [r.get() for r in group.foreach_learner(_lora_view)]
        synced = group.get_state()["learner"]["rl_module"][DEFAULT_MODULE_ID]
    finally:
        group.shutdown()
    for view in views:
        for name, value in alone["model"].items():
            torch.testing.assert_close(view["model"][name], value, atol=1e-6, rtol=0)
            if not lora.is_adapter_key(name):
                assert torch.equal(view["model"][name], before["model"][name]), name
        assert view["optimized"] == view["with_state"] == view["trainable"] == alone["adapters"]
        assert view["held"] == alone["held"]  # replicas: the whole adapter state on each
    assert any(not torch.equal(alone["model"][k], before["model"][k]) for k in alone["adapters"])
    assert sorted(k for k in synced if k != lora.LORA_SETTINGS) == alone["adapters"]
