"""DPH-RL: pre-sampling split, the D_pef connector, the DPH learner and config validation."""

import json
import shutil
import zlib

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

import rllib_dph.envs
from rllib_dph import columns as C
from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.dph.pef_rows import AddPefRows, PefRowSampler
from rllib_dph.files import sha256_of, write_checksum
from rllib_dph.algorithms.dph.presample import (
    IDENTITY_FILE,
    PefFileError,
    PresampleConfig,
    prepare_pef,
    presample,
    presample_once,
    read_identity,
    read_metadata,
)

TOY_ENV = "rllib_dph_test/Toy-v0"
KINDS = ["always"] * 6 + ["never"] * 6 + ["sometimes"] * 6


def toy_verifier(completion: str, ground_truth: str) -> bool:
    """'always' tasks are solved by any answer, 'never' by none, 'sometimes' by half of them."""
    if ground_truth == "sometimes":
        return zlib.crc32(completion.encode()) % 2 == 0
    return ground_truth == "always"


rllib_dph.envs.register_verifier_env(
    TOY_ENV,
    verifier=toy_verifier,
    data=[
        {
            "id": f"toy-{i}",
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"Question {i}: say something."}],
            "reward_model": {"style": "rule", "ground_truth": kind},
        }
        for i, kind in enumerate(KINDS)
    ],
)


def _presample_config(out_dir, **kw):
    return PresampleConfig(
        model_name="tiny-random",
        env=TOY_ENV,
        out_dir=str(out_dir),
        k=4,
        min_correct=3,
        sampling={"max_new_tokens": 8},
        prompts_per_chunk=5,
        **kw,
    )


@pytest.fixture(scope="module")
def presampled(tmp_path_factory):
    out = tmp_path_factory.mktemp("presample")
    summary = presample(_presample_config(out), progress=False)
    return out, summary


def test_presample_split_and_refinement(presampled):
    out, summary = presampled
    pef = pq.read_table(out / "d_pef.parquet").to_pylist()
    exp = pq.read_table(out / "d_exp.parquet").to_pylist()
    pef_kinds = {r["reward_model"]["ground_truth"] for r in pef}
    assert {r["id"] for r in pef} >= {f"toy-{i}" for i, k in enumerate(KINDS) if k == "always"}
    assert "never" not in pef_kinds
    assert len(pef) + len(exp) == len(KINDS) == summary["num_prompts"]
    assert summary["num_pef"] == len(pef) and summary["num_exp"] == len(exp)
    assert not {r["id"] for r in pef} & {r["id"] for r in exp}
    for row in pef:
        assert row["pass_count"] >= 3
        assert len(row["response_ids"]) == len(row["ref_logp"]) > 0
        assert all(lp <= 0 for lp in row["ref_logp"])
    # The refinement sample decides: candidates whose extra sample failed moved to D_exp.
    assert summary["num_candidates"] - summary["num_refinement_failures"] == len(pef)
    assert summary["pass_count_histogram"][4] >= 6  # the 'always' tasks
    meta = read_metadata(out / "d_pef.parquet")
    assert meta["model_name"] == "tiny-random" and len(meta["model_fingerprint"]) > 8
    # D_exp is a valid `data=` input of the env.
    tasks = rllib_dph.envs.load_tasks(str(out / "d_exp.parquet"), task="generic")
    assert [t.id for t in tasks] == [r["id"] for r in exp]


def test_stored_reference_logprobs_match_the_base_model(presampled):
    from rllib_dph.models.hub import load_causal_lm

    out, _ = presampled
    model = load_causal_lm("tiny-random")
    for row in pq.read_table(out / "d_pef.parquet").to_pylist()[:3]:
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        targets = ids[0, 1:]
        recomputed = logp.gather(-1, targets[:, None])[:, 0][len(row["prompt_ids"]) - 1 :]
        np.testing.assert_allclose(recomputed.detach().numpy(), row["ref_logp"], atol=1e-4)


def test_presample_resume_gives_identical_files_without_duplicates(presampled, tmp_path):
    out, _ = presampled
    first = pq.read_table(out / "d_pef.parquet")
    # A run interrupted after two sample chunks: only those part files exist.
    run = tmp_path / "run"
    (run / "parts").mkdir(parents=True)
    for name in ["sample-00000.parquet", "sample-00001.parquet"]:
        (run / "parts" / name).write_bytes((out / "parts" / name).read_bytes())
    (run / IDENTITY_FILE).write_bytes((out / IDENTITY_FILE).read_bytes())  # written when the run began
    presample(_presample_config(run), progress=False)
    resumed = pq.read_table(run / "d_pef.parquet")
    assert resumed.to_pylist() == first.to_pylist()
    assert len(set(resumed.column("id").to_pylist())) == resumed.num_rows


def test_connector_ratio_masks_and_shards(presampled):
    out, _ = presampled
    path = str(out / "d_pef.parquet")
    total = pq.read_metadata(path).num_rows
    connector = AddPefRows(path=path, ratio=8)
    exp = {
        C.INPUT_IDS: np.ones((16, 5), dtype=np.int64),
        C.ATTENTION_MASK: np.ones((16, 5), dtype=np.int64),
        C.RESPONSE_MASK: np.pad(np.ones((16, 2), dtype=np.int64), [(0, 0), (3, 0)]),
        C.BEHAVIOR_LOGP: -np.ones((16, 5), dtype=np.float32),
        C.PROMPT_LENGTH: np.full(16, 3), C.RESPONSE_LENGTH: np.full(16, 2),
        C.REWARDS: np.zeros(16, dtype=np.float32), C.ADVANTAGES: np.zeros(16, dtype=np.float32),
        C.CORRECT: np.zeros(16, dtype=bool), C.TRUNCATED: np.zeros(16, dtype=bool),
        C.GROUP_IDS: np.repeat(np.arange(4), 4), C.ROW_TYPE: np.zeros(16, dtype=np.int64),
    }
    mixed = connector(batch={DEFAULT_MODULE_ID: exp})[DEFAULT_MODULE_ID]
    is_pef = mixed[C.ROW_TYPE] == C.ROW_TYPE_PEF
    assert is_pef.sum() == 2 and (~is_pef).sum() == 16  # 8 : 1
    assert (mixed[C.REF_LOGP][~is_pef] == 0).all()
    assert (mixed[C.REF_LOGP][is_pef][mixed[C.RESPONSE_MASK][is_pef] == 1] < 0).all()
    assert (mixed[C.ADVANTAGES][is_pef] == 0).all()
    np.testing.assert_array_equal(mixed[C.RESPONSE_MASK][is_pef].sum(1), mixed[C.RESPONSE_LENGTH][is_pef])
    # Each learner reads its own shard; together the shards are the whole file.
    shards = [PefRowSampler(path, shard_index=r, num_shards=2) for r in range(2)]
    seen = [{tuple(p + q) for p, q in zip(s.prompt_ids, s.response_ids)} for s in shards]
    assert not seen[0] & seen[1] and len(shards[0]) + len(shards[1]) == total
    # One pass over a shard returns each row once, then it reshuffles.
    sampler = PefRowSampler(path)
    rows = sampler.take(len(sampler))[C.INPUT_IDS]
    assert len({tuple(r[r > 0]) for r in rows}) == len(sampler) and sampler.passes == 1
    sampler.take(1)
    assert sampler.passes == 2


def _dph_config(pef_path, **dph):
    return (
        DPHConfig()
        .environment(TOY_ENV)
        .llm(model_name="tiny-random", max_response_length=8)
        .training(group_size=4, prompts_per_step=2, lr=1e-3, minibatch_size=None)
        .dph(pef_path=str(pef_path), presample={"k": 4, "min_correct": 3}, **dph)  # the file's selection
        .debugging(seed=0)
    )


def test_dph_js_run_loads_no_reference_model(ray_session, presampled):
    out, _ = presampled
    algo = _dph_config(out / "d_pef.parquet", divergence="js", pef_coeff=0.2, pef_ratio=4).build_algo()
    result = algo.train()
    logged = result["learners"][DEFAULT_MODULE_ID]
    assert logged["num_pef_tokens"] > 0 and logged["num_exploration_tokens"] > 0
    # The stored log-probs are the initial policy's: before any update u = π_θ/π_ref = 1.
    assert abs(logged["pef_u_mean"] - 1.0) < 1e-3 and logged["pef_loss"] < 1e-6
    for key in ("pef_loss", "pef_log_ratio_mean", "policy_loss", "total_loss"):
        assert key in logged
    assert all(r.get() for r in algo.learner_group.foreach_learner(lambda learner: learner.ref_model is None))
    algo.stop()


def test_js_definition_uses_a_reference_model(ray_session, presampled):
    out, _ = presampled
    config = _dph_config(out / "d_pef.parquet", divergence="js_definition", exp_path=str(out / "d_exp.parquet"))
    config.validate()
    learner = config.build_learner(env=envs_make())
    assert learner.ref_model is not None
    num_pef = pq.read_metadata(out / "d_pef.parquet").num_rows
    num_exp = pq.read_metadata(out / "d_exp.parquet").num_rows
    assert learner.js_beta1 == pytest.approx(config.pef_coeff * num_pef / num_exp)


def envs_make():
    import gymnasium as gym

    return gym.make(TOY_ENV).unwrapped


@pytest.mark.parametrize(
    "dph, message",
    [
        ({"divergence": "alpha", "alpha": 1.5}, "alpha=1.5 is invalid: it must be a finite number in (0, 1)"),
        ({"divergence": "tv"}, "divergence='tv' is not one of"),
        ({"pef_ratio": 0}, "pef_ratio=0 is invalid: it must be a finite number > 0"),
        ({"pef_coeff": float("nan")}, "pef_coeff=nan is invalid: it must be a finite number >= 0"),
        ({"pef_loss_normalization": "rows"}, "pef_loss_normalization='rows' is not one of"),
        ({"presample": {"k": 4, "min_correct": 5}}, "presample: min_correct=5 must be <= k=4"),
        ({"presample": {"k": 0}}, "presample: k=0 is invalid: it must be an int >= 1"),
        ({"presample": {"pef_samples": 0}}, "presample: pef_samples=0 must be 'all'"),
        ({"presample": PresampleConfig(sampling={"temperature": 0.5})},
         "presample.sampling=SamplingParams(n=1, temperature=0.5, top_p=1.0, max_new_tokens=128, seed=0, "
         "top_k_logprobs=0): pre-sampling takes sampling from the training config"),
        ({"pef_path": None}, "no D_pef file"),
        ({"divergence": "js_definition"}, "divergence='js_definition' needs the D_exp file"),
    ],
)
def test_validate_messages(presampled, dph, message):
    out, _ = presampled
    config = _dph_config(out / "d_pef.parquet").dph(**dph)
    with pytest.raises(ValueError) as err:
        config.validate()
    assert message in str(err.value)


def test_presample_is_one_embedded_presample_config():
    """A dict sets only its keys (also through ``update_from_dict``, as ``--config`` does); the
    run takes training's model and sampling; a key that is none of its fields is refused."""
    config = DPHConfig().llm(temperature=0.7).dph(presample={"out_dir": "run", "k": 4})
    config.dph(presample={"min_correct": 2})
    config.update_from_dict({"presample": {"pef_samples": "all"}})
    stage = config.presample_config()
    assert (stage.out_dir, stage.k, stage.min_correct, stage.pef_samples) == ("run", 4, 2, "all")
    assert (stage.model_name, stage.sampling.temperature) == (config.model_name, 0.7)
    assert config.presample.sampling == PresampleConfig().sampling
    with pytest.raises(TypeError, match=r"DPHConfig.dph\(\) got an unexpected keyword argument 'presample_min_correct'"):
        DPHConfig().dph(presample_min_correct=8)
    with pytest.raises(ValueError, match="'kk' is none of them"):
        DPHConfig().dph(presample={"kk": 8})


def test_presample_samples_with_training_sampling_params():
    """Pre-sampling draws with the training config's one SamplingParams (``sampling_params``,
    n=1: the stage draws k; no top-K); a sampling name in ``presample`` is refused (it is none of
    the stage's keys), also through ``update_from_dict``; ``sampling.n`` is refused in favour of k."""
    config = (DPHConfig().llm(temperature=0.7, top_p=0.9, max_response_length=48)
              .training(group_size=4, rollout_top_k=3).debugging(seed=5).dph(presample={"k": 6}))
    sampling = config.presample_config().sampling
    assert sampling == config.sampling_params(n=1, top_k_logprobs=0)
    assert (sampling.n, sampling.temperature, sampling.top_p, sampling.max_new_tokens, sampling.seed,
            sampling.top_k_logprobs) == (1, 0.7, 0.9, 48, 5, 0)
    assert config.sampling_params().n == 4 and config.sampling_params().top_k_logprobs == 3
    with pytest.raises(ValueError, match="'temperature' is none of them"):
        DPHConfig().dph(presample={"temperature": 0.7})
    with pytest.raises(ValueError, match="'max_response_length' is none of them"):
        DPHConfig().update_from_dict({"presample": {"max_response_length": 64}})
    with pytest.raises(ValueError, match="set k instead of sampling.n"):
        PresampleConfig(model_name="tiny-random", env=TOY_ENV, sampling={"n": 4}).validate()


def test_js_definition_is_a_divergence_not_a_flag():
    with pytest.raises(TypeError, match="js_definition"):
        DPHConfig().dph(js_definition=True)


def test_validate_refuses_js_definition_without_reference_model(presampled):
    out, _ = presampled
    config = _dph_config(out / "d_pef.parquet", divergence="js_definition").llm(reference_model=None)
    with pytest.raises(ValueError, match="needs a live reference model"):
        config.validate()


def _copy_run(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def test_presample_once_reuses_its_own_directory_and_sets_aside_another_runs(presampled, tmp_path):
    out, _ = presampled
    run = _copy_run(out, tmp_path / "run")
    assert not presample_once(_presample_config(run), progress=False)  # made for this very run
    identity = read_identity(run)
    stale = dict(identity, model_fingerprint="0123456789abcdef")  # e.g. before the model was rebuilt
    (run / IDENTITY_FILE).write_text(json.dumps(stale))
    with pytest.warns(UserWarning, match="model_fingerprint '0123456789abcdef' -> "):
        assert presample_once(_presample_config(run), progress=False)
    assert read_identity(run) == identity
    assert read_identity(run / "stale" / "000") == stale  # nothing deleted
    assert pq.read_table(run / "d_pef.parquet").to_pylist() == pq.read_table(out / "d_pef.parquet").to_pylist()
    # Parts of an unknown run (no identity.json) are never resumed from.
    unknown = tmp_path / "unknown"
    (unknown / "parts").mkdir(parents=True)
    table = pq.read_table(out / "parts" / "sample-00000.parquet")
    pq.write_table(table.slice(0, 0), unknown / "parts" / "sample-00000.parquet")  # would drop 5 prompts
    with pytest.warns(UserWarning, match="has no identity.json"):
        presample(_presample_config(unknown), progress=False)
    assert pq.read_table(unknown / "d_pef.parquet").to_pylist() == pq.read_table(out / "d_pef.parquet").to_pylist()


def test_validate_checks_fields_only(tmp_path):
    """validate() reads no file (Ray calls it several times per trial): a missing D_pef file is
    refused by prepare_pef, which DPH.setup and `rllib train`'s preparation call."""
    config = _dph_config(tmp_path / "missing" / "d_pef.parquet")
    config.validate()
    with pytest.raises(PefFileError, match="does not exist; run `rllib presample` first"):
        prepare_pef(config)


def _pef_folder(presampled, folder, *, rows=None, **identity):
    """A copy of the pre-sampled D_pef file (its first ``rows`` rows) with its identity.json,
    whose entries ``identity`` replaces."""
    out, _ = presampled
    folder.mkdir()
    table = pq.read_table(out / "d_pef.parquet")
    pq.write_table(table if rows is None else table.slice(0, rows), folder / "d_pef.parquet")
    write_checksum(folder / "d_pef.parquet", sha256_of(folder / "d_pef.parquet"))
    (folder / IDENTITY_FILE).write_text(json.dumps({**read_identity(out), **identity}))
    return folder / "d_pef.parquet"


def test_prepare_pef_refuses_d_pef_of_another_model_and_empty_files(presampled, tmp_path):
    """Moved from validate(): the D_pef file is checked by prepare_pef against its identity.json."""
    other = _pef_folder(presampled, tmp_path / "other", model_fingerprint="0123456789abcdef")
    with pytest.raises(PefFileError, match="was made by a model with fingerprint 0123456789abcdef, but the policy"):
        prepare_pef(_dph_config(other))
    empty = _pef_folder(presampled, tmp_path / "empty", rows=0)
    with pytest.raises(PefFileError, match="is empty"):
        prepare_pef(_dph_config(empty))
    moved = tmp_path / "moved.parquet"
    shutil.copy(other, moved)
    shutil.copy(f"{other}.sha256", f"{moved}.sha256")
    with pytest.raises(PefFileError, match="has no identity.json beside it"):
        prepare_pef(_dph_config(moved))
    assert prepare_pef(_dph_config(presampled[0] / "d_pef.parquet"))[0] == str(presampled[0] / "d_pef.parquet")


def test_a_dph_trial_hashes_the_model_folder_once(ray_session, presampled, tmp_path, monkeypatch):
    """validate() hashes nothing, DPH.setup hashes the policy's folder once, and a later
    preparation (another trial, `rllib train`) finds its fingerprint kept."""
    from pathlib import Path

    from rllib_dph.models import folders
    from rllib_dph.models.hub import resolve_model

    model_dir = resolve_model("tiny-random")
    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path / "home"))  # no fingerprint kept yet
    hashed, original = [], folders.folder_fingerprint
    monkeypatch.setattr(folders, "folder_fingerprint", lambda path: hashed.append(str(path)) or original(path))
    config = _dph_config(presampled[0] / "d_pef.parquet").llm(model_name=model_dir)
    algo = config.build_algo()  # validates the config several times, then DPH.setup
    algo.stop()
    assert hashed == [str(Path(model_dir).resolve())]
    prepare_pef(config)
    assert len(hashed) == 1
