"""The update at the paper's batch shapes: D_pef rows in every mini-batch, one distribution for
μ, π_θ and π_ref, global token-mean across learners, η as the original code meant it, skipped
non-finite steps, D_pef sampling settings and the pre-sampling lock."""

import math
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_dph import columns as C
from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.learners.splits import minibatch_plan, shard_groups
from rllib_dph.algorithms.dph.presample import PefFileError, PresampleConfig, prepare_pef, presample_once
from rllib_dph.policy.rl_module import LOGP

from test_dph import TOY_ENV, envs_make  # registers the toy env

GROUP = 4


def _presample(out_dir, **sampling):
    config = PresampleConfig(
        model_name="tiny-random", env=TOY_ENV, out_dir=str(out_dir), k=4, min_correct=3,
        sampling={"max_new_tokens": 8, **sampling}, prompts_per_chunk=9,
    )
    presample_once(config, progress=False)
    return out_dir / "d_pef.parquet"


@pytest.fixture(scope="module")
def pef_file(tmp_path_factory):
    return _presample(tmp_path_factory.mktemp("presample"))


def _dph_config(pef_path, **dph):
    return (
        DPHConfig()
        .environment(TOY_ENV)
        .llm(model_name="tiny-random", max_response_length=8)
        .training(group_size=GROUP, prompts_per_step=8, lr=1e-3, grad_clip=None)
        .dph(pef_path=str(pef_path), presample={"k": 4, "min_correct": 3}, **dph)  # the file's selection
        .debugging(seed=0)
    )


def _exploration_batch(config, num_prompts, seed=0):
    """Sampled rows of ``num_prompts`` groups with random rewards (non-zero advantages)."""
    from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner
    from rllib_dph.losses.advantages import group_advantages

    runner = LLMEnvRunner(config=config.copy(copy_frozen=False))
    batch = runner.sample(num_prompts=num_prompts)
    rewards = np.random.default_rng(seed).integers(0, 2, len(batch[C.REWARDS])).astype(np.float32)
    batch[C.REWARDS] = rewards
    batch[C.ADVANTAGES] = group_advantages(torch.as_tensor(rewards), torch.as_tensor(batch[C.GROUP_IDS])).numpy()
    return batch


def _wrap(batch):
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=len(batch[C.INPUT_IDS]))


def _spy_on_steps(learner):
    """Records the rows of every mini-batch the learner computes a loss on."""
    steps = []
    original = learner.compute_loss_for_module

    def spy(*, module_id, config, batch, fwd_out):
        steps.append({k: batch[k].cpu().numpy() for k in (C.ROW_TYPE, C.GROUP_IDS)})
        return original(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)

    learner.compute_loss_for_module = spy
    return steps


# ---------------------------------------------------------------------- 1. D_pef in every step
def test_minibatch_plan_keeps_groups_whole_and_spreads_pef_rows():
    group_ids = np.r_[np.repeat(np.arange(16), 8), np.full(16, -1)]  # 128 exploration + 16 D_pef
    row_type = np.r_[np.zeros(128), np.ones(16)].astype(np.int64)
    for rng in (None, np.random.default_rng(0)):
        plan = minibatch_plan(group_ids, row_type, 4, rng)
        assert sorted(np.concatenate(plan).tolist()) == list(range(144))
        for rows in plan:
            exp = rows[row_type[rows] == 0]
            assert len(exp) == 32 and (np.bincount(group_ids[exp])[np.unique(group_ids[exp])] == 8).all()
            assert (row_type[rows] == 1).sum() == 4  # 16 / 4: the 8:1 share of every step


def test_paper_shapes_put_d_pef_rows_in_every_minibatch():
    """4096 exploration + 512 D_pef rows, mini-batch 512: 8 steps of 512 + 64 (before: 7 had none)."""
    group_ids = np.r_[np.repeat(np.arange(256), 16), np.full(512, -1)]
    row_type = np.r_[np.zeros(4096), np.ones(512)].astype(np.int64)
    plan = minibatch_plan(group_ids, row_type, 8, np.random.default_rng(1))
    assert [int((row_type[rows] == 1).sum()) for rows in plan] == [64] * 8


def test_shard_groups_gives_whole_groups_and_pads_empty_learners():
    batch = {
        C.INPUT_IDS: np.ones((12, 3), dtype=np.int64), C.RESPONSE_MASK: np.ones((12, 3), dtype=np.int64),
        C.ADVANTAGES: np.ones(12, dtype=np.float32), C.GROUP_IDS: np.repeat([5, 9, 2], 4),
        C.ROW_TYPE: np.zeros(12, dtype=np.int64),
    }
    shards = shard_groups(batch, 2)
    assert [len(s[C.GROUP_IDS]) for s in shards] == [8, 4]
    assert [sorted(set(s[C.GROUP_IDS])) for s in shards] == [[5, 9], [2]]
    padded = shard_groups(batch, 4)[3]
    assert len(padded[C.INPUT_IDS]) == 1 and padded[C.RESPONSE_MASK].sum() == 0 and padded[C.ADVANTAGES][0] == 0


@pytest.mark.parametrize("num_epochs", [1, 2])
def test_d_pef_term_acts_in_every_optimizer_step(pef_file, num_epochs):
    config = _dph_config(pef_file, pef_ratio=4.0).training(minibatch_size=8, num_epochs=num_epochs)
    learner = config.build_learner(env=envs_make())
    steps = _spy_on_steps(learner)
    batch = _exploration_batch(config, num_prompts=8)  # 32 exploration rows + 8 D_pef rows
    logged = learner.update(batch=_wrap(batch), num_epochs=num_epochs, minibatch_size=8)[DEFAULT_MODULE_ID]
    assert len(steps) == 4 * num_epochs
    for step in steps:
        is_pef = step[C.ROW_TYPE] == C.ROW_TYPE_PEF
        assert is_pef.sum() == 2  # 8 exploration rows : 2 D_pef rows in every step
        counts = np.unique(step[C.GROUP_IDS][~is_pef], return_counts=True)[1]
        assert (counts == GROUP).all()  # groups stay whole
    assert logged["pef_rows_min"].peek() == 2 and logged["pef_rows_max"].peek() == 2
    assert logged["pef_weight"].peek() > 0


# ---------------------------------------------------------------- 2. one distribution everywhere
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.7])
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_logp_equals_mu_and_u_is_one_before_the_first_update(tmp_path, top_p, temperature):
    pef_path = _presample(tmp_path, temperature=temperature, top_p=top_p)
    config = _dph_config(pef_path).llm(temperature=temperature, top_p=top_p)
    config.validate()
    learner = config.build_learner(env=envs_make())
    exp = _exploration_batch(config, num_prompts=4)
    mixed = learner.pef_connector(batch={DEFAULT_MODULE_ID: exp})[DEFAULT_MODULE_ID]
    tensors = {k: torch.as_tensor(v) for k, v in mixed.items()}
    with torch.no_grad():
        logp = learner.module[DEFAULT_MODULE_ID].forward_train(tensors)[LOGP]
    response = tensors[C.RESPONSE_MASK].bool()
    is_pef = (tensors[C.ROW_TYPE] == C.ROW_TYPE_PEF)[:, None] & response
    is_exp = ~(tensors[C.ROW_TYPE] == C.ROW_TYPE_PEF)[:, None] & response
    assert is_pef.any() and is_exp.any()
    assert (logp - tensors[C.BEHAVIOR_LOGP]).abs()[is_exp].max() <= 1e-4
    assert (logp - tensors[C.REF_LOGP]).abs()[is_pef].max() <= 1e-4  # u = 1 on every D_pef token


# ------------------------------------------------------------------- 3. D_pef sampling settings
@pytest.mark.parametrize(
    "override, message",
    [
        ({"temperature": 0.7}, "was sampled with temperature=1.0, but this config has temperature=0.7"),
        ({"top_p": 0.9}, "was sampled with top_p=1.0, but this config has top_p=0.9"),
        ({"max_response_length": 16}, "was sampled with max_response_length=8"),
    ],
)
def test_prepare_pef_refuses_d_pef_sampled_with_other_settings(pef_file, override, message):
    """Moved from validate() to prepare_pef (DPH.setup, `rllib train`'s preparation)."""
    config = _dph_config(pef_file).llm(**override)
    config.validate()  # fields only
    with pytest.raises(PefFileError, match=message) as err:
        prepare_pef(config)
    assert "re-run pre-sampling" in str(err.value)


def test_d_pef_file_records_how_it_was_sampled(pef_file):
    from rllib_dph.algorithms.dph.presample import read_metadata

    meta = read_metadata(pef_file)
    assert (meta["temperature"], meta["top_p"], meta["max_response_length"]) == ("1.0", "1.0", "8")
    assert meta["chat_template_sha"] and meta["schema_version"] == "3" and meta["pef_samples"] == "refine"


def test_concurrent_presampling_of_one_directory_samples_once(tmp_path):
    config = PresampleConfig(
        model_name="tiny-random", env=TOY_ENV, out_dir=str(tmp_path / "shared"), k=2, min_correct=1,
        sampling={"max_new_tokens": 4},
    )
    ran = []
    threads = [threading.Thread(target=lambda: ran.append(presample_once(config, progress=False))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(ran) == [False, True]
    assert pq.read_metadata(tmp_path / "shared" / "d_pef.parquet").num_rows > 0


def test_validate_builds_no_model(pef_file, tmp_path, monkeypatch):
    """A policy that is not built yet is not built by validate(); the check waits for setup.
    (tiny-random ships with no build, so under an empty cache it must be built to be used.)"""
    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path / "empty_home"))
    _dph_config(pef_file).llm(model_name="tiny-random").validate()
    assert not (tmp_path / "empty_home" / "models").exists()


# ------------------------------------------------------------- 4. token-mean over all learners
def _module_state(learner):
    model = learner.module[DEFAULT_MODULE_ID].unwrapped().model
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_learners_take_the_step_of_one(ray_session):
    """2 DDP learners (gloo) on shards of unequal token counts vs 1 learner on the whole batch."""
    config = (
        GRPOConfig()
        .environment(TOY_ENV)
        .llm(model_name="tiny-random", max_response_length=12)
        .training(group_size=GROUP, prompts_per_step=3, lr=1e-4, grad_clip=None)
        .debugging(seed=0)
    )
    batch = _exploration_batch(config, num_prompts=3)  # 3 groups: shards of 2 and 1 groups
    local = config.build_learner(env=envs_make())
    local.update(batch=_wrap(batch))
    expected = _module_state(local)
    expected_grads = {k: p.grad.clone() for k, p in local.module[DEFAULT_MODULE_ID].model.named_parameters()}

    group = config.copy(copy_frozen=False).learners(num_learners=2, num_cpus_per_learner=0.5).build_learner_group(env=envs_make())
    try:
        group.update(batches=[_wrap(shard) for shard in shard_groups(batch, 2)], num_minibatches=1)
        state_of = lambda learner: (  # noqa: E731 (a lambda travels to the learners by value)
            {k: v.detach().clone() for k, v in learner.module[DEFAULT_MODULE_ID].unwrapped().model.state_dict().items()},
            {k: p.grad.clone() for k, p in learner.module[DEFAULT_MODULE_ID].unwrapped().model.named_parameters()},
        )
        results = [r.get() if hasattr(r, "get") else r for r in group.foreach_learner(state_of)]
    finally:
        group.shutdown()
    for state, grads in results:
        for name, value in expected.items():
            torch.testing.assert_close(state[name], value, atol=1e-5, rtol=0)
        for name, value in expected_grads.items():  # the step's gradient itself, not only Adam's sign
            torch.testing.assert_close(grads[name], value, atol=1e-7, rtol=1e-4)
    assert any(not torch.equal(expected[k], v) for k, v in _module_state(config.build_learner(env=envs_make())).items())


# ------------------------------------------------------------------------- 5. η normalisation
def _gradients(learner, batch):
    module = learner.module[DEFAULT_MODULE_ID]
    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    module.model.zero_grad()
    loss = learner.compute_loss_for_module(
        module_id=DEFAULT_MODULE_ID, config=learner.config, batch=tensors, fwd_out=module.forward_train(tensors)
    )
    loss.backward()
    return torch.cat([p.grad.flatten() for p in module.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("divergence, scale", [("js", 2.0), ("forward_kl", 1.0)])
def test_original_normalization_weighs_the_pef_term_by_its_row_share(pef_file, divergence, scale):
    """Gradient of η·term under "original" / under "token_mean" = s_f · N_pef / N_exp."""
    base = _dph_config(pef_file, divergence=divergence, pef_ratio=4.0)
    batch = _exploration_batch(base, num_prompts=4)  # 16 exploration rows
    learner = base.copy(copy_frozen=False).dph(pef_coeff=0.0).build_learner(env=envs_make())
    mixed = learner.pef_connector(batch={DEFAULT_MODULE_ID: batch})[DEFAULT_MODULE_ID]  # + 4 D_pef rows
    mixed[C.REF_LOGP] = mixed[C.REF_LOGP] - 0.5 * mixed[C.RESPONSE_MASK]  # u ≠ 1: the term has a gradient
    policy_only = _gradients(learner, mixed)
    pef_grads = {}
    for normalization in ("original", "token_mean"):
        learner.config = base.copy(copy_frozen=False).dph(pef_coeff=0.2, pef_loss_normalization=normalization)
        pef_grads[normalization] = _gradients(learner, mixed) - policy_only
    ratio = pef_grads["original"].norm() / pef_grads["token_mean"].norm()
    assert ratio.item() == pytest.approx(scale * 4 / 16, rel=1e-4)
    torch.testing.assert_close(pef_grads["original"], pef_grads["token_mean"] * scale * 4 / 16, rtol=1e-3, atol=1e-7)


# ---------------------------------------------------------------------- 7. non-finite updates
def test_non_finite_step_is_skipped_and_training_continues(pef_file):
    config = _dph_config(pef_file)
    learner = config.build_learner(env=envs_make())
    batch = _exploration_batch(config, num_prompts=4)
    poisoned = dict(batch, **{C.ADVANTAGES: np.full_like(batch[C.ADVANTAGES], np.nan)})
    before = _module_state(learner)
    logged = learner.update(batch=_wrap(poisoned))[DEFAULT_MODULE_ID]
    assert logged["skipped_updates"].peek() == 1 and logged["consecutive_skipped_updates"].peek() == 1
    assert all(torch.equal(before[k], v) for k, v in _module_state(learner).items())
    optimizer = learner.get_optimizer(DEFAULT_MODULE_ID)
    assert all(not optimizer.state[p] for p in optimizer.param_groups[0]["params"])  # Adam untouched
    logged = learner.update(batch=_wrap(batch))[DEFAULT_MODULE_ID]
    assert logged["skipped_updates"].peek() == 0 and logged["consecutive_skipped_updates"].peek() == 0
    assert any(not torch.equal(before[k], v) for k, v in _module_state(learner).items())


def test_training_stops_after_too_many_skipped_steps_in_a_row(ray_session, pef_file):
    algo = _dph_config(pef_file).training(max_consecutive_skipped_updates=3).build_algo()
    try:
        algo.train()  # one finite update
        build = algo.build_train_batch
        algo.build_train_batch = lambda: {**(b := build()), C.ADVANTAGES: np.full_like(b[C.ADVANTAGES], np.inf)}
        algo.train()
        algo.train()
        with pytest.raises(Exception, match=r"iteration 4: 3 optimizer steps in a row .* Last finite learner metrics: \{"):
            algo.train()
    finally:
        algo.stop()
