"""Warm starts: a resumable short SFT of a base model, cached under its own fingerprint."""

import dataclasses
import json

import pytest
import torch

import rllib_dph.models.build.sft as sft_module
from rllib_dph.models import catalog
from rllib_dph.models.build import warm_start
from rllib_dph.models.build.warm_start import build_warm_start
from rllib_dph.models.catalog import BUNDLED_MODELS, WarmStartSpec, is_current
from rllib_dph.models.build.prepare import prepare_model
from rllib_dph.models.hub import load_causal_lm

SPEC = WarmStartSpec(base="tiny-random", sft_steps=4, batch_size=2, warmup_steps=1, lr=1e-3, checkpoint_every=2)


@pytest.fixture
def tiny_warm_start(monkeypatch):
    monkeypatch.setitem(catalog.WARM_STARTS, "tiny-sft-test", SPEC)
    return "tiny-sft-test"


@pytest.fixture
def base_dir():
    return prepare_model("tiny-random", progress=False).location


def _weights(folder):
    return {k: v.clone() for k, v in load_causal_lm(str(folder), dtype=torch.float32).state_dict().items()}


def test_smollm2_warm_start_is_a_model_name():
    assert "smollm2-135m-sft" in BUNDLED_MODELS
    assert catalog.WARM_STARTS["smollm2-135m-sft"].base == "smollm2-135m-instruct"


def test_the_longer_smollm2_warm_start_sees_the_ties_approach_five_times_as_often():
    """``smollm2-135m-sft-600`` is the 120-step recipe run 5x longer, nothing else: its corpus
    holds the same share of `= (SELECT MAX(...))` answers among the highest/lowest ones (~15 %),
    and 4x as many of them (47 against 12), which is what taught SmolLM2 the approach."""
    from rllib_dph.envs.suites.sql_query import sql_approach

    short, long = catalog.WARM_STARTS["smollm2-135m-sft"], catalog.WARM_STARTS["smollm2-135m-sft-600"]
    assert "smollm2-135m-sft-600" in BUNDLED_MODELS
    assert dataclasses.replace(long, sft_steps=short.sft_steps) == short and long.sft_steps == 600
    counts = {}
    for spec in (short, long):
        approaches = [sql_approach(ex["completion"]) for ex in warm_start.training_examples(spec)
                      if ex["task_id"].startswith("sql_synth/")]
        counts[spec.sft_steps] = (approaches.count("extremum"), approaches.count("order_limit"))
    assert counts == {120: (12, 66), 600: (47, 270)}
    for extremum, order_limit in counts.values():
        assert 0.1 < extremum / (extremum + order_limit) < 0.2


def test_the_nulls_warm_starts_add_the_null_family_to_the_pool_and_nothing_else():
    """``smollm2-135m-sft-nulls`` is the 120-step recipe with ``sql_synth/train_nulls`` in its pool,
    ``smollm2-135m-sft-600-nulls`` the same 5x longer; each seeded draw answers about a fifth of
    the family's questions with `COUNT(col)`."""
    from rllib_dph.envs.suites.sql_query import count_approach

    short, nulls = catalog.WARM_STARTS["smollm2-135m-sft"], catalog.WARM_STARTS["smollm2-135m-sft-nulls"]
    long = catalog.WARM_STARTS["smollm2-135m-sft-600-nulls"]
    assert {"smollm2-135m-sft-nulls", "smollm2-135m-sft-600-nulls"} <= set(BUNDLED_MODELS)
    assert dataclasses.replace(nulls, splits=short.splits) == short
    assert nulls.splits == (*short.splits, "sql_synth/train_nulls")
    assert dataclasses.replace(long, sft_steps=short.sft_steps) == nulls and long.sft_steps == 600
    counts = {}
    for spec in (nulls, long):
        family = [count_approach(ex["completion"]) for ex in warm_start.training_examples(spec)
                  if ex["task_id"].startswith("sql_synth/train_nulls/")]
        counts[spec.sft_steps] = (len(family), family.count("count_col"))
    assert counts == {120: (183, 33), 600: (853, 173)}


def test_warm_start_trains_records_and_resumes(tmp_path, monkeypatch, tiny_warm_start, base_dir):
    """A build killed after its first checkpoint resumes there and ends with the weights of an
    uninterrupted build; the record names the spec, the base and the styles trained on."""
    clean = build_warm_start(tiny_warm_start, tmp_path / "clean", base_dir=base_dir, checkpoint_dir=tmp_path / "ckpt-clean", progress=False)
    assert clean["sft"]["examples"] == 8 and sum(clean["sft"]["styles"].values()) == 8
    assert clean["spec"]["base"] == "tiny-random" and len(clean["fingerprint"]) == 16
    assert is_current(tmp_path / "clean", tiny_warm_start)
    assert not (tmp_path / "ckpt-clean").exists()  # removed after a complete build
    base = _weights(base_dir)
    trained = _weights(tmp_path / "clean")
    assert any(not torch.equal(base[k], trained[k]) for k in base)

    calls = []
    loss = sft_module.completion_loss

    def dies_at_step_3(model, batch):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return loss(model, batch)

    monkeypatch.setattr(sft_module, "completion_loss", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        build_warm_start(tiny_warm_start, tmp_path / "resumed", base_dir=base_dir, checkpoint_dir=tmp_path / "ckpt", progress=False)
    assert (tmp_path / "ckpt" / sft_module.SFT_STATE).is_file()
    monkeypatch.setattr(sft_module, "completion_loss", loss)
    resumed = build_warm_start(tiny_warm_start, tmp_path / "resumed", base_dir=base_dir, checkpoint_dir=tmp_path / "ckpt", progress=False)
    assert {k: v for k, v in resumed["sft"].items() if k != "seconds"} == {k: v for k, v in clean["sft"].items() if k != "seconds"}
    again = _weights(tmp_path / "resumed")
    for name, value in trained.items():
        torch.testing.assert_close(again[name], value, atol=0, rtol=0)


def test_a_changed_spec_is_not_current(tmp_path, monkeypatch, tiny_warm_start, base_dir):
    build_warm_start(tiny_warm_start, tmp_path / "m", base_dir=base_dir, progress=False)
    monkeypatch.setitem(catalog.WARM_STARTS, tiny_warm_start, WarmStartSpec(**{**SPEC.__dict__, "lr": 2e-3}))
    assert not is_current(tmp_path / "m", tiny_warm_start)
    record = json.loads((tmp_path / "m" / catalog.BUILD_RECORD).read_text())
    assert record["spec"]["lr"] == 1e-3


def test_a_changed_corpus_is_not_current(tmp_path, monkeypatch, tiny_warm_start, base_dir):
    """A build trained on other SFT examples than its recipe's pinned ones (the suites changed
    and the new corpus was pinned) is not current, though its spec is unchanged; a build of a
    corpus that is not the pinned one is refused."""
    build_warm_start(tiny_warm_start, tmp_path / "m", base_dir=base_dir, progress=False)
    record = json.loads((tmp_path / "m" / catalog.BUILD_RECORD).read_text())
    assert record["corpus_sha256"] == warm_start.corpus_fingerprint(warm_start.training_examples(SPEC))
    recipe = catalog.corpus_recipe(SPEC)
    monkeypatch.setitem(catalog.CORPORA, tiny_warm_start, (recipe, record["corpus_sha256"]))
    assert is_current(tmp_path / "m", tiny_warm_start)
    monkeypatch.setitem(catalog.CORPORA, tiny_warm_start, (recipe, "0" * 64))
    assert not is_current(tmp_path / "m", tiny_warm_start)
    with pytest.raises(ValueError, match="not the pinned 0000"):
        build_warm_start(tiny_warm_start, tmp_path / "n", base_dir=base_dir, progress=False)


def test_the_freshness_check_reads_no_corpus(tmp_path, monkeypatch, tiny_warm_start, base_dir):
    build_warm_start(tiny_warm_start, tmp_path / "m", base_dir=base_dir, progress=False)
    monkeypatch.setattr(warm_start, "training_examples", lambda spec: pytest.fail("the corpus was made"))
    assert is_current(tmp_path / "m", tiny_warm_start)


def test_a_field_added_to_a_dataclass_in_the_spec_takes_its_default(tmp_path, monkeypatch, tiny_warm_start, base_dir):
    """A record written before a field of a dataclass inside the spec existed (``countdown.worked``)
    is current while the spec holds that field's default, and not otherwise."""
    from rllib_dph.envs.countdown import TINY_COUNTDOWN

    build_warm_start(tiny_warm_start, tmp_path / "m", base_dir=base_dir, progress=False)
    path = tmp_path / "m" / catalog.BUILD_RECORD
    record = json.loads(path.read_text())
    older = {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(TINY_COUNTDOWN))).items() if k != "worked"}
    path.write_text(json.dumps({**record, "spec": {**record["spec"], "countdown": older}}))
    monkeypatch.setitem(catalog.WARM_STARTS, tiny_warm_start, dataclasses.replace(SPEC, countdown=TINY_COUNTDOWN))
    assert is_current(tmp_path / "m", tiny_warm_start)
    worked = dataclasses.replace(TINY_COUNTDOWN, worked=True)
    monkeypatch.setitem(catalog.WARM_STARTS, tiny_warm_start, dataclasses.replace(SPEC, countdown=worked))
    assert not is_current(tmp_path / "m", tiny_warm_start)


def test_every_named_warm_start_has_its_corpus_pinned():
    assert set(catalog.CORPORA) == set(catalog.WARM_STARTS)


@pytest.mark.parametrize("name", sorted(catalog.CORPORA))
def test_every_pinned_corpus_is_what_its_recipe_makes(name):
    """The pins are true: each named warm start's recipe makes exactly its pinned SFT examples."""
    spec = catalog.WARM_STARTS[name]
    if spec.countdown is not None:
        pytest.importorskip("reasoning_gym", reason='tiny-countdown\'s corpus needs pip install -e ".[reasoning-gym]"')
    recipe, pinned = catalog.CORPORA[name]
    assert catalog.corpus_recipe(spec) == recipe, f"{name!r}'s recipe changed: pin {catalog.corpus_recipe(spec)!r}"
    made = warm_start.corpus_fingerprint(warm_start.training_examples(spec))
    assert made == pinned, f"the SFT corpus of {name!r} changed: pin {made!r} in catalog.CORPORA"
