"""The built tiny-sql-math model ships with the package: nothing is trained before RL starts."""

import json
import shutil

import pytest

from rllib_dph.models import catalog
from rllib_dph.models.build.tiny import corpus_fingerprint, sft_corpus
from rllib_dph.models.catalog import BUILD_RECORD, SHIPPED_DIR, is_current
from rllib_dph.models.hub import load_causal_lm, load_tokenizer, resolve_model


def test_shipped_build_is_current_small_and_complete():
    path = SHIPPED_DIR / "tiny-sql-math"
    assert is_current(path, "tiny-sql-math"), "re-copy a fresh `rllib build-model tiny-sql-math --force` build"
    files = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", BUILD_RECORD} <= files
    size_mb = sum(p.stat().st_size for p in path.iterdir()) / 2**20
    assert size_mb < 10, size_mb
    record = json.loads((path / BUILD_RECORD).read_text())
    assert 0.3 <= record["metrics"]["sql_test/greedy_acc"] <= 0.7  # the measured base policy it ships with
    assert record["corpus_sha256"] == corpus_fingerprint(sft_corpus()), (
        "the suites' training data changed since the shipped build: bump catalog.TINY_BUILD_VERSION and re-ship a "
        "fresh `rllib build-model tiny-sql-math --force` build"
    )
    from rllib_dph.envs.suites.sql_suite import TIES_FAMILY_VERSION

    assert record["metrics"]["sql_ties/family_version"] == TIES_FAMILY_VERSION, (
        "the ties family changed since the shipped record's sql_ties metrics were measured: re-measure them "
        "(a `rllib build-model tiny-sql-math --force` build; the weights do not depend on the family)"
    )


def test_resolve_model_uses_the_shipped_build_without_building(tmp_path, monkeypatch):
    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path / "home"))
    assert resolve_model("tiny-sql-math") == str(SHIPPED_DIR / "tiny-sql-math")
    assert not (tmp_path / "home").exists()  # nothing built, nothing cached
    model = load_causal_lm("tiny-sql-math")
    assert model.config.vocab_size == len(load_tokenizer("tiny-sql-math"))


def test_a_stale_shipped_build_is_ignored(tmp_path, monkeypatch):
    shipped = tmp_path / "bundled"
    shutil.copytree(SHIPPED_DIR / "tiny-sql-math", shipped / "tiny-sql-math")
    record = json.loads((shipped / "tiny-sql-math" / BUILD_RECORD).read_text())
    record["build_version"] -= 1  # made by an older build recipe
    (shipped / "tiny-sql-math" / BUILD_RECORD).write_text(json.dumps(record))
    monkeypatch.setattr(catalog, "SHIPPED_DIR", shipped)
    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError, match="not built at"):
        resolve_model("tiny-sql-math")
