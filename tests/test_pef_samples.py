"""D_pef with every trajectory: ``PresampleConfig.pef_samples`` and ``full_data``."""

import dataclasses
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rllib_dph.algorithms.dph.presample import PresampleConfig, presample, read_metadata
from test_dph import KINDS, _presample_config


@pytest.fixture(scope="module")
def presampled_all(tmp_path_factory):
    out = tmp_path_factory.mktemp("presample_all")
    return out, presample(_presample_config(out, pef_samples="all"), progress=False)


def _by_prompt(rows):
    groups = {}
    for row in rows:
        groups.setdefault(row["id"], []).append(row)
    return groups


def test_all_keeps_every_correct_sample_with_its_own_logprobs(presampled_all):
    out, summary = presampled_all
    rows = pq.read_table(out / "d_pef.parquet").to_pylist()
    groups = _by_prompt(rows)
    # 'always' prompts are right in all k = 4 samples: 4 trajectories each, samples 0..3.
    always = {f"toy-{i}" for i, kind in enumerate(KINDS) if kind == "always"}
    assert always <= set(groups)
    for prompt_id, trajectories in groups.items():
        assert len(trajectories) == trajectories[0]["pass_count"] >= 3
        assert sorted(t["sample_index"] for t in trajectories) == sorted({t["sample_index"] for t in trajectories})
        assert all(0 <= t["sample_index"] < 4 for t in trajectories)
        assert len({t["prompt_ids"] and tuple(t["prompt_ids"]) for t in trajectories}) == 1
    assert summary["num_pef"] == len(groups) and summary["num_pef_trajectories"] == len(rows)
    assert summary["num_pef_trajectories"] > summary["num_pef"]
    # No refinement stage: every candidate stays.
    assert summary["num_candidates"] == summary["num_pef"]
    meta = read_metadata(out / "d_pef.parquet")
    assert meta["pef_samples"] == "all" and meta["schema_version"] == "3"


def test_each_trajectory_carries_the_base_models_logprobs(presampled_all):
    """Every stored trajectory of one prompt has its own ref_logp, equal to a recomputation."""
    from rllib_dph.models.hub import load_causal_lm

    out, _ = presampled_all
    model = load_causal_lm("tiny-random")
    trajectories = next(iter(_by_prompt(pq.read_table(out / "d_pef.parquet").to_pylist()).values()))
    assert len({tuple(t["response_ids"]) for t in trajectories}) > 1  # different samples, not copies
    for row in trajectories:
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        recomputed = logp.gather(-1, ids[0, 1:, None])[:, 0][len(row["prompt_ids"]) - 1 :]
        np.testing.assert_allclose(recomputed.detach().numpy(), row["ref_logp"], atol=1e-4)


def test_an_integer_keeps_at_most_that_many(presampled_all, tmp_path):
    all_rows = _by_prompt(pq.read_table(presampled_all[0] / "d_pef.parquet").to_pylist())
    presample(_presample_config(tmp_path, pef_samples=2), progress=False)
    rows = _by_prompt(pq.read_table(tmp_path / "d_pef.parquet").to_pylist())
    assert set(rows) == set(all_rows)
    for prompt_id, trajectories in rows.items():
        assert [t["sample_index"] for t in trajectories] == [t["sample_index"] for t in all_rows[prompt_id]][:2]


def test_refine_keeps_the_refinement_sample(tmp_path):
    summary = presample(_presample_config(tmp_path), progress=False)
    rows = pq.read_table(tmp_path / "d_pef.parquet").to_pylist()
    assert len(rows) == summary["num_pef"] == summary["num_pef_trajectories"]
    assert {r["sample_index"] for r in rows} == {4}  # k: the sample after the first k


def test_full_data_keeps_every_prompt_in_d_exp(tmp_path):
    config = dataclasses.replace(_presample_config(tmp_path, pef_samples=1, full_data=True), min_correct=1)
    summary = presample(config, progress=False)
    exp = pq.read_table(tmp_path / "d_exp.parquet").to_pylist()
    pef = pq.read_table(tmp_path / "d_pef.parquet").to_pylist()
    assert len(exp) == len(KINDS) == summary["num_exp"]
    assert {r["id"] for r in pef} <= {r["id"] for r in exp}
    assert "never" not in {r["reward_model"]["ground_truth"] for r in pef}


@pytest.mark.parametrize("value", ["every", 0, -1, 1.5, True, "8"])
def test_bad_pef_samples_are_refused(value):
    with pytest.raises(ValueError, match=r"pef_samples=.* must be 'all'"):
        PresampleConfig(model_name="tiny-random", env="x", pef_samples=value).validate()


def test_a_directory_made_with_another_rule_is_set_aside_not_reinterpreted(presampled_all, tmp_path):
    """Files made by another ``pef_samples`` rule are moved to stale/ and sampled again."""
    from rllib_dph.algorithms.dph.presample import presample_once

    run = tmp_path / "run"
    presample(_presample_config(run), progress=False)  # "refine": one trajectory per prompt
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert presample_once(_presample_config(run, pef_samples="all"), progress=False)
    assert any("pef_samples 'refine' -> 'all'" in str(w.message) for w in caught)
    assert (run / "stale" / "000" / "d_pef.parquet").is_file()
    assert read_metadata(run / "d_pef.parquet")["pef_samples"] == "all"


def test_a_file_given_by_pef_path_is_read_only_as_the_recipe_the_config_names(presampled_all, tmp_path):
    """``pef_path`` bypasses the stage's set-aside, so ``prepare_pef`` refuses a file selected by
    other rules than the config's ``presample`` (all 4 trajectories read as "refine", say), and
    one made before ``pef_samples`` was recorded; the file is used once the config names it."""
    import json
    import shutil

    from rllib_dph.algorithms.dph.presample import PefFileError, prepare_pef
    from test_dph import _dph_config

    out, _ = presampled_all  # k=4, min_correct=3, pef_samples="all"
    with pytest.raises(PefFileError) as err:
        prepare_pef(_dph_config(out / "d_pef.parquet"))  # presample pef_samples: the default "refine"
    assert ("was selected with pef_samples='all', but this config's presample has pef_samples='refine'"
            in str(err.value))
    assert "set .dph(presample={'pef_samples': 'all'})" in str(err.value)
    with pytest.raises(PefFileError, match=r"min_correct=3, pef_samples='all', but .* min_correct=8, pef_samples="):
        prepare_pef(_dph_config(out / "d_pef.parquet").dph(presample={"min_correct": 8}))
    named = _dph_config(out / "d_pef.parquet").dph(presample={"pef_samples": "all"})
    assert prepare_pef(named)[0] == str(out / "d_pef.parquet")

    old = tmp_path / "schema2"  # identity.json as an rllib_dph without pef_samples wrote it
    shutil.copytree(out, old)
    identity = json.loads((old / "identity.json").read_text())
    del identity["pef_samples"]
    (old / "identity.json").write_text(json.dumps(identity))
    with pytest.raises(PefFileError, match="was made before pre-sampling recorded pef_samples"):
        prepare_pef(_dph_config(old / "d_pef.parquet").dph(presample={"pef_samples": "all"}))


def test_table_4s_rows_of_one_seed_sample_once_and_choose_among_the_same_samples(tmp_path, monkeypatch):
    """Stage 1's k samples per prompt are kept in $RLLIB_DPH_HOME/presample/samples/<key>: a
    directory that differs only in min_correct / pef_samples / full_data draws none of them again
    and its D_pef holds the same trajectories; another seed draws its own; an engine given by the
    caller neither takes nor keeps shared samples."""
    import rllib_dph.algorithms.dph.presample as presample_module
    from rllib_dph.engines import build_engine

    from rllib_dph.models.build.prepare import prepare_model

    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path / "home"))
    prepare_model("tiny-random", progress=False)  # presample() resolves its model, never builds it
    drawn = []
    real_chunks = presample_module.rollout_chunks

    def counted(*args, **kwargs):
        for chunk, indices, result in real_chunks(*args, **kwargs):
            drawn.append((args[3].n, result is not None))
            yield chunk, indices, result

    monkeypatch.setattr(presample_module, "rollout_chunks", counted)
    first = presample(_presample_config(tmp_path / "all", pef_samples="all"), progress=False)
    assert drawn and all(sampled for _, sampled in drawn)
    drawn.clear()
    two = dataclasses.replace(_presample_config(tmp_path / "two"), pef_samples=2, min_correct=4, full_data=True)
    second = presample(two, progress=False)
    assert not any(sampled for n, sampled in drawn if n == 4)  # stage 1 (k = 4) taken from the shared folder
    assert second["pass_count_histogram"] == first["pass_count_histogram"]
    every = {(r["id"], tuple(r["response_ids"])) for r in pq.read_table(tmp_path / "all" / "d_pef.parquet").to_pylist()}
    chosen = {(r["id"], tuple(r["response_ids"])) for r in pq.read_table(tmp_path / "two" / "d_pef.parquet").to_pylist()}
    assert chosen and chosen <= every
    drawn.clear()
    seed1 = _presample_config(tmp_path / "seed1", pef_samples="all")
    presample(dataclasses.replace(seed1, sampling=dataclasses.replace(seed1.sampling, seed=1)), progress=False)
    assert drawn and all(sampled for _, sampled in drawn)
    assert len(list((tmp_path / "home" / "presample" / "samples").iterdir())) == 2
    drawn.clear()
    config = _presample_config(tmp_path / "given", pef_samples="all")  # the first run's sampling, seed 0
    presample(config, engine=build_engine(config), progress=False)
    assert drawn and all(sampled for _, sampled in drawn)
    assert len(list((tmp_path / "home" / "presample" / "samples").iterdir())) == 2
