"""FSDP2 sharded learners on CPU (gloo): the step of one learner, half the bytes each, full-state
checkpoints, the weight sync to the rollout engine, and ``rllib train`` with ``sharding="fsdp2"``."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.batch import shard_groups
from rllib_dph.sharding import held_bytes

from test_dph import TOY_ENV, envs_make  # registers the toy env
from test_update_correctness import GROUP, _exploration_batch, _wrap

SHARDED = {"num_learners": 2, "num_cpus_per_learner": 0.5}


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


def test_fsdp2_algorithm_syncs_full_weights_and_restores(ray_session, tmp_path):
    """After a training step the rollout engine holds the gathered full weights; an algorithm
    checkpoint restores them."""
    config = _config().training(prompts_per_step=2).learners(sharding="fsdp2", **SHARDED)
    algo = config.build_algo()
    try:
        algo.train()
        learner_state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
        engine_state = algo.env_runner.engine.model.state_dict()
        assert set(learner_state) == set(engine_state)
        for name, value in learner_state.items():
            torch.testing.assert_close(engine_state[name].float(), torch.as_tensor(value), atol=0, rtol=0)
        algo.save_to_path(tmp_path / "algo")
        algo.train()
        algo.restore_from_path(tmp_path / "algo")
        restored = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
        for name, value in learner_state.items():
            torch.testing.assert_close(torch.as_tensor(restored[name]), torch.as_tensor(value), atol=0, rtol=0)
    finally:
        algo.stop()


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
