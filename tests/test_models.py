"""Tiny models: tokenizer, chat template, SFT pieces, name resolution, loading and fingerprints.

Fast: only the untrained ``tiny-random`` model is built (seconds), into a temporary
``$RLLIB_DPH_HOME``. The full ``tiny-sql-math`` build is exercised by the ``learning`` test.
"""

import json
import shutil

import numpy as np
import pytest
import torch

from rllib_dph.envs import suites
from rllib_dph.cli import main as cli
from rllib_dph.models import catalog, hub
from rllib_dph.chat import encode_prompt
from rllib_dph.evaluation.metrics import pass_at_k
from rllib_dph.models.build.prepare import build_model, prepare_model
from rllib_dph.models.hub import (
    load_causal_lm,
    load_tokenizer,
    model_fingerprint,
    resolve_model,
)
from rllib_dph.models.build.tiny import CHAT_TEMPLATE, corpus_texts, sft_corpus, train_tokenizer
from rllib_dph.models.catalog import BUILD_RECORD, TINY_BUILD_VERSION, TINY_MODELS, TinyModelSpec
from rllib_dph.models.build.sft import bucketed_batches, collate, completion_loss, encode_example, lr_at, sft


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A private RLLIB_DPH_HOME for this module."""
    path = tmp_path_factory.mktemp("rllib_dph_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLLIB_DPH_HOME", str(path))
        yield path


@pytest.fixture(scope="module")
def tiny_random(home):
    """Path of the ``tiny-random`` model built into the temporary home."""
    return prepare_model("tiny-random", progress=False).location


@pytest.fixture(scope="module")
def tokenizer(tiny_random):
    return load_tokenizer(tiny_random)


def _suite_texts():
    rows = suites.sft_examples("sql_synth/train")[:50:7] + suites.sft_examples("math_synth/train")[:30:4]
    return [r["messages"][0]["content"] for r in rows] + [r["completion"] for r in rows]


def test_tokenizer_round_trips_suite_texts(tokenizer):
    texts = _suite_texts() + ["unicode ünïcödé — 数学 \t tabs  and   spaces\n\n"]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    # The BPE learned the suites' vocabulary: SQL is far shorter than one token per byte.
    sql = "SELECT singer_name FROM singer WHERE age > 30"
    assert len(tokenizer(sql)["input_ids"]) < len(sql) / 3


def test_special_tokens(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer("<|im_start|>user")["input_ids"][0] == 1  # never split into characters
    assert len(tokenizer) <= TINY_MODELS["tiny-random"].vocab_size


def test_chat_template_and_encode_prompt(tokenizer):
    messages = [{"role": "user", "content": "How many singers?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nHow many singers?<|im_end|>\n<|im_start|>assistant\n"
    no_prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    assert no_prompt == "<|im_start|>user\nHow many singers?<|im_end|>\n"

    ids = encode_prompt(tokenizer, tuple(messages))  # Task.messages is a tuple of mappings
    assert type(ids) is list and all(type(i) is int for i in ids)
    assert tokenizer.decode(ids) == text
    assert ids.count(tokenizer.eos_token_id) == 1 and ids[0] == 1
    # transformers 5 returns a BatchEncoding from tokenize=True; encode_prompt gives the same ids.
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert list(encoded["input_ids"]) == ids


def test_encode_prompt_without_chat_template(tokenizer):
    plain = load_tokenizer(tokenizer.name_or_path)
    plain.chat_template = None
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert plain.decode(encode_prompt(plain, messages)) == "Be brief.\n\n2+2?"


def test_saved_tokenizer_loads_back_unchanged(tokenizer):
    # AutoTokenizer picks Qwen2Tokenizer for a qwen2 model and rebuilds the pre-tokenizer: the
    # built tokenizer must be the same object in memory and after loading.
    trained = train_tokenizer(corpus_texts(sft_corpus()), TINY_MODELS["tiny-random"].vocab_size)
    assert type(tokenizer) is type(trained)
    assert tokenizer.backend_tokenizer.to_str() == trained.backend_tokenizer.to_str()
    for text in _suite_texts():
        assert tokenizer(text)["input_ids"] == trained(text)["input_ids"]


def test_tokenizer_training_is_deterministic():
    texts = _suite_texts()
    a = train_tokenizer(texts, 400)
    b = train_tokenizer(texts, 400)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert a.chat_template == CHAT_TEMPLATE
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_tokenizer(texts, 100)


def test_encode_example_and_collate_mask_the_prompt(tokenizer):
    messages = [{"role": "user", "content": "Count singers."}]
    short = encode_example(tokenizer, messages, "```sql\nSELECT 1\n```")
    long = encode_example(tokenizer, messages, "```sql\nSELECT COUNT(*) FROM singer\n```")
    ids, mask = long
    num_prompt = len(encode_prompt(tokenizer, messages))
    assert ids[:num_prompt] == encode_prompt(tokenizer, messages)
    assert mask == [0] * num_prompt + [1] * (len(ids) - num_prompt)
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[num_prompt:]) == "```sql\nSELECT COUNT(*) FROM singer\n```<|im_end|>"

    batch = collate([short, long], pad_id=tokenizer.pad_token_id)
    B, T = batch["input_ids"].shape
    assert (B, T) == (2, len(long[0]))
    assert batch["attention_mask"].sum(1).tolist() == [len(short[0]), len(long[0])]
    # Labels are the token ids on completion tokens (EOS included), -100 on prompt and padding.
    assert (batch["labels"] != -100).sum(1).tolist() == [sum(short[1]), len(ids) - num_prompt]
    assert batch["labels"][1, num_prompt:].tolist() == ids[num_prompt:]
    assert (batch["labels"][0, len(short[0]) :] == -100).all()


def test_a_conversation_masks_its_observations(tokenizer):
    """Turns and observations alternate; the loss covers each turn and its EOS, not the
    observation (rendered as the chat template renders a user message between two turns)."""
    messages = [{"role": "user", "content": "Count singers."}]
    ids, mask = encode_example(tokenizer, messages, ["<query>SELECT 1</query>", "1\n(1 rows)", "```sql\nSELECT 1\n```"])
    prompt = len(encode_prompt(tokenizer, messages))
    policy = [t for t, m in zip(ids, mask) if m]
    assert tokenizer.decode(policy) == "<query>SELECT 1</query><|im_end|>```sql\nSELECT 1\n```<|im_end|>"
    assert mask[:prompt] == [0] * prompt and mask[-1] == 1
    whole = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": "<query>SELECT 1</query>"}, {"role": "user", "content": "1\n(1 rows)"},
                    {"role": "assistant", "content": "```sql\nSELECT 1\n```"}], tokenize=False)
    assert tokenizer.decode(ids) == whole.rstrip("\n")
    with pytest.raises(ValueError, match="odd number of parts"):
        encode_example(tokenizer, messages, ["<query>SELECT 1</query>", "1"])


def test_bucketed_batches_cover_every_example_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 200, size=103)
    batches = bucketed_batches(lengths, 8, rng)
    assert sorted(np.concatenate(batches).tolist()) == list(range(103))
    assert sorted(len(b) for b in batches)[1:] == [8] * 12
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < 0.2 * np.ptp(lengths)  # batches group similar lengths
    again = bucketed_batches(lengths, 8, np.random.default_rng(0))
    assert [b.tolist() for b in again] != [b.tolist() for b in batches]  # the rng moved on


def test_lr_schedule():
    spec = TinyModelSpec(sft_steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(0, spec) == pytest.approx(1e-4)
    assert lr_at(9, spec) == pytest.approx(1e-3)
    assert lr_at(55, spec) == pytest.approx(0.55e-3)  # half-way through the cosine
    assert lr_at(100, spec) == pytest.approx(1e-4)
    assert all(lr_at(s, spec) >= lr_at(s + 1, spec) for s in range(10, 100))


@pytest.mark.parametrize(
    "n,c,k,expected",
    [(8, 0, 1, 0.0), (8, 2, 1, 0.25), (8, 2, 8, 1.0), (8, 1, 4, 0.5), (4, 2, 2, 1 - 1 / 6), (8, 8, 1, 1.0)],
)
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k=9 with n=8 samples; k must be in"):
        pass_at_k(8, 1, 9)


def test_quality_check_samples_through_the_rollout_path(monkeypatch):
    from rllib_dph.evaluation import base_model

    load_split = suites.load_split
    monkeypatch.setattr(base_model.suites, "load_split", lambda name: load_split(name)[:4])
    model, tokenizer = load_causal_lm("tiny-sql-math"), load_tokenizer("tiny-sql-math")
    metrics = base_model.evaluate_base_policy(model, tokenizer, samples=4, max_new_tokens=96, progress=False)

    assert set(metrics) == {
        "sql_test/greedy_acc", "sql_test/greedy_styles", "sql_test/pass@1", "sql_test/pass@4",
        "sql_test/sample_styles", "sql_test/correct_sample_styles", "sql_test_cross/greedy_acc",
        "math_test/greedy_acc", "sql_ties/family_version", "sql_ties/greedy_acc", "sql_ties/greedy_approaches",
        "sql_ties/pass@1", "sql_ties/pass@4", "sql_ties/sample_approaches", "sql_ties/correct_sample_approaches",
        "sql_nulls/greedy_acc", "sql_nulls/greedy_approaches", "sql_nulls/pass@1", "sql_nulls/pass@4",
        "sql_nulls/sample_approaches", "sql_nulls/correct_sample_approaches",
    }
    assert set(metrics["sql_nulls/sample_approaches"]) <= {"count_star", "count_col", "other", "none"}
    assert sum(metrics["sql_ties/sample_approaches"].values()) == 16
    assert list(metrics["sql_ties/sample_approaches"])[:2] == ["order_limit", "extremum"]
    assert 0 <= metrics["sql_test/pass@1"] <= metrics["sql_test/pass@4"] <= 1
    assert sum(metrics["sql_test/greedy_styles"].values()) == 4
    assert sum(metrics["sql_test/sample_styles"].values()) == 16
    assert list(metrics["sql_test/sample_styles"])[:5] == list(suites.STYLES["sql_synth"])
    assert metrics["sql_test/greedy_acc"] > 0  # the shipped model solves some SQL prompts greedily


def test_sft_learns_completions(tokenizer, tiny_random):
    torch.manual_seed(0)
    examples = [
        encode_example(tokenizer, [{"role": "user", "content": f"Echo {w}."}], f"```sql\nSELECT '{w}'\n```")
        for w in ["Dale", "Boston", "Spain", "Japan"]
    ]
    spec = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64,
                         sft_steps=40, batch_size=4, lr=1e-2, warmup_steps=5)
    from rllib_dph.models.build.tiny import build_model as build_qwen2

    model = build_qwen2(tokenizer, spec)
    batch = collate(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        before = completion_loss(model, batch).item()
    losses = sft(model, examples, spec, pad_id=tokenizer.pad_token_id, progress=False)
    with torch.no_grad():
        after = completion_loss(model, batch).item()
    assert len(losses) == 40 and losses[0] == pytest.approx(before, rel=1e-4)
    assert after < 0.3 * before
    assert not model.training


def test_resolve_model(home, tiny_random, tmp_path, monkeypatch):
    assert tiny_random == str(home / "models" / "tiny-random")
    record = json.loads((home / "models" / "tiny-random" / BUILD_RECORD).read_text())
    assert record["name"] == "tiny-random" and record["spec"]["sft_steps"] == 0 and "metrics" not in record
    stamp = (home / "models" / "tiny-random" / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny-random") == tiny_random  # cached: not rebuilt
    assert prepare_model("tiny-random").location == tiny_random
    assert (home / "models" / "tiny-random" / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in (home / "models").iterdir() if p.name.startswith(".") and p.is_dir()]

    record["build_version"] -= 1  # a build made by older code: not resolved, rebuilt by the next preparation
    (home / "models" / "tiny-random" / BUILD_RECORD).write_text(json.dumps(record))
    with pytest.raises(hub.ModelNotFoundError, match="rllib build-model tiny-random"):
        resolve_model("tiny-random")
    assert (home / "models" / "tiny-random" / "model.safetensors").stat().st_mtime_ns == stamp  # resolving never builds
    assert prepare_model("tiny-random", progress=False).location == tiny_random
    assert (home / "models" / "tiny-random" / "model.safetensors").stat().st_mtime_ns != stamp
    rebuilt = json.loads((home / "models" / "tiny-random" / BUILD_RECORD).read_text())
    assert rebuilt["build_version"] == TINY_BUILD_VERSION

    assert resolve_model(str(tmp_path)) == str(tmp_path)  # a local directory, as is
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # an HF id, unchanged
    monkeypatch.setattr(catalog, "SHIPPED_DIR", tmp_path / "nothing_shipped")  # shipped builds: tests/test_shipped_model.py
    with pytest.raises(FileNotFoundError, match="rllib build-model tiny-sql-math"):
        resolve_model("tiny-sql-math")
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        resolve_model(str(tmp_path / "missing"))


def test_locate_model_gives_kind_location_fingerprint_and_typed_errors(home, tiny_random, tmp_path, monkeypatch):
    ref = hub.locate_model("tiny-random")
    assert (ref.kind, ref.location) == ("bundled", tiny_random)
    assert ref.fingerprint() == model_fingerprint("tiny-random") == model_fingerprint(tiny_random)
    assert hub.locate_model(tiny_random) == hub.ModelRef(tiny_random, "folder", tiny_random)
    assert hub.locate_model("Qwen/Qwen2.5-0.5B-Instruct") == hub.ModelRef(
        "Qwen/Qwen2.5-0.5B-Instruct", "hub", "Qwen/Qwen2.5-0.5B-Instruct")

    monkeypatch.setattr(catalog, "SHIPPED_DIR", tmp_path / "nothing_shipped")
    with pytest.raises(hub.ModelNotFoundError) as unbuilt:
        hub.locate_model("tiny-sql-math")
    assert (unbuilt.value.kind, unbuilt.value.name) == ("bundled", "tiny-sql-math")
    assert "not built at" in unbuilt.value.reason and "rllib build-model tiny-sql-math" in unbuilt.value.fix
    monkeypatch.chdir(tmp_path)
    with pytest.raises(hub.ModelNotFoundError) as missing:
        hub.locate_model("./missing")
    assert (missing.value.kind, missing.value.reason) == ("folder", "no such model folder")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(hub.ModelNotFoundError) as uncached:
        hub.locate_model("someorg/not-cached-model").fingerprint()
    assert uncached.value.kind == "hub" and "hf download someorg/not-cached-model" in uncached.value.fix


@pytest.mark.parametrize(
    "dtype,expected",
    [(None, torch.float32), ("float32", torch.float32), ("bfloat16", torch.bfloat16),
     ("bf16", torch.bfloat16), (torch.float16, torch.float16)],
)
def test_load_causal_lm_dtype(tiny_random, dtype, expected):
    model = load_causal_lm("tiny-random", dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {expected}
    assert not model.training
    assert model.config.pad_token_id == 0 and model.generation_config.eos_token_id == 2
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # tied
    logits = model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits  # (1, 4, V)
    assert logits.shape == (1, 4, model.config.vocab_size) and logits.dtype == expected
    assert torch.isfinite(logits).all()


def test_load_causal_lm_rejects_unknown_dtype(tiny_random):
    with pytest.raises(ValueError, match="dtype='float8' is not supported; use one of"):
        load_causal_lm(tiny_random, dtype="float8")


def test_fingerprint_stable_and_sensitive(tiny_random, tmp_path):
    fingerprint = model_fingerprint(tiny_random)
    assert len(fingerprint) == 16 and fingerprint == model_fingerprint("tiny-random")
    copy = tmp_path / "copy"
    shutil.copytree(tiny_random, copy)
    (copy / BUILD_RECORD).write_text("{}")  # not a weight or tokenizer file
    assert model_fingerprint(str(copy)) == fingerprint

    model = load_causal_lm(str(copy))
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-3
    model.save_pretrained(copy)
    assert model_fingerprint(str(copy)) != fingerprint

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no weight files"):
        model_fingerprint(str(empty))


def test_fingerprint_is_kept_until_a_file_changes(tiny_random, tmp_path, monkeypatch):
    """The weights are read once per state of the folder's files; a same-size rewrite that keeps
    the old mtime (a copy with ``cp -p``) is still seen (its ctime changed) and hashed again."""
    import os

    from rllib_dph.models import folders

    copy = tmp_path / "copy"
    shutil.copytree(tiny_random, copy)
    hashed, original = [], folders.folder_fingerprint
    monkeypatch.setattr(folders, "folder_fingerprint", lambda path: hashed.append(path) or original(path))
    first = model_fingerprint(str(copy))
    assert model_fingerprint(str(copy)) == first and len(hashed) == 1  # kept
    config = copy / "tokenizer_config.json"
    stat, data = config.stat(), config.read_bytes()
    config.write_bytes(data[:-1] + (b"\n" if data.endswith(b" ") else b" "))  # same size, other bytes
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert config.stat().st_size == stat.st_size and config.stat().st_mtime_ns == stat.st_mtime_ns
    assert model_fingerprint(str(copy)) != first and len(hashed) == 2


def test_build_is_deterministic_and_cli_prints_summary(tiny_random, home, tmp_path, capsys):
    before = model_fingerprint(tiny_random)
    cli.main(["build-model", "tiny-random", "--force"])  # the one build command, into $RLLIB_DPH_HOME
    printed = capsys.readouterr().out
    assert "tiny-random:" in printed and f"fingerprint {before}" in printed
    assert model_fingerprint(str(home / "models" / "tiny-random")) == before

    out = tmp_path / "again"
    record = build_model("tiny-random", out, progress=False)
    assert build_model("tiny-random", out, progress=False) == record  # already built: returns its record
    assert record == json.loads((out / BUILD_RECORD).read_text())
    (tmp_path / ".again.writing-killed").mkdir()  # the leftover of a killed build (files.atomic_dir)
    build_model("tiny-random", out, force=True, progress=False)  # rebuilt in place, atomically
    assert model_fingerprint(str(out)) == model_fingerprint(tiny_random)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".again.lock", "again"]


@pytest.mark.learning
def test_tiny_sql_math_is_competent_imperfect_and_diverse(tmp_path):
    """The full build (minutes): the base policy the DPH-RL experiments start from."""
    from rllib_dph.evaluation.base_model import evaluate_base_policy

    record = build_model("tiny-sql-math", tmp_path / "tiny-sql-math", progress=False, evaluate=evaluate_base_policy)
    m = record["metrics"]
    assert 0.3 <= m["sql_test/greedy_acc"] <= 0.7
    assert m["sql_test/pass@8"] >= m["sql_test/pass@1"] + 0.1
    assert all(m["sql_test/sample_styles"][style] > 0 for style in suites.STYLES["sql_synth"])
    assert m["math_test/greedy_acc"] > 0
