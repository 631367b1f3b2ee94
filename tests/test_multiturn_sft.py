"""SFT traces of the SQLMultiTurn-v0 protocol: the traces are the env's own
episodes, their encoding is the rollout's token for token with the loss on policy turns only,
and the ``tiny-sql-math-mt`` warm start built on them resolves by name."""

import json
import re
from collections import Counter

import numpy as np
import pytest

from rllib_dph import columns as C
from rllib_dph.rollout.batch import sequence_rows
from rllib_dph.engines.base import Completion
from rllib_dph.envs.sql.multiturn import SQLMultiTurnEnv, sft_trace, sft_traces
from rllib_dph.envs.suites import sft_examples
from rllib_dph.envs.suites.storage import suite_root
from rllib_dph.models import catalog
from rllib_dph.models.build import warm_start
from rllib_dph.models.build.sft import encode_example
from rllib_dph.models.build.warm_start import training_examples
from rllib_dph.models.catalog import BUNDLED_MODELS, WarmStartSpec, is_current
from rllib_dph.models.build.prepare import prepare_model
from rllib_dph.models.hub import load_tokenizer, locate_model
from rllib_dph.rollout.episodes import Episode, encode_task, take_turn

SPLIT = "sql_synth/train"
TURNS = re.compile(r"You have (\d+) turns in all")


@pytest.fixture(scope="module")
def traces():
    return sft_traces(SPLIT, sft_examples(SPLIT)[:60], seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-sql-math")


def _env_of(trace) -> tuple[SQLMultiTurnEnv, int]:
    """A fresh env with the trace's turn budget (read off its prompt) and the task's index."""
    env = SQLMultiTurnEnv(SPLIT, max_turns=int(TURNS.search(trace["messages"][-1]["content"]).group(1)))
    return env, [t.id for t in env.tasks].index(trace["task_id"])


def test_traces_observations_are_what_the_env_returns(traces):
    """Replaying each trace's queries in a fresh env gives its observations back; its answer
    is correct; budgets of one turn answer at once; both probes and direct answers occur."""
    kinds = Counter(t["probe"] for t in traces)
    assert kinds[None] and kinds["solution"] and kinds["table"]
    for trace in traces:
        env, index = _env_of(trace)
        assert trace["messages"] == [dict(m) for m in env.tasks[index].messages]
        env.reset(options={"index": index})
        parts = trace["completion"]
        assert len(parts) == (1 if trace["probe"] is None else 3)
        if trace["probe"] is not None:
            assert env.max_turns > 1 and parts[0].startswith("<query>")
            observation, _, terminated, truncated, _ = env.step(parts[0])
            assert observation == parts[1] and not (terminated or truncated)
        _, reward, terminated, _, info = env.step(parts[-1])
        assert terminated and info["correct"] and reward == 1.0
    solution = next(t for t in traces if t["probe"] == "solution")
    assert solution["completion"][1].endswith("rows)")  # the rows of the task's own solution


def test_a_trace_that_is_not_an_episode_is_refused():
    env = SQLMultiTurnEnv(SPLIT, max_turns=2)
    with pytest.raises(ValueError, match="last must be exploratory queries"):
        sft_trace(env, 0, ["```sql\nSELECT 1\n```"])  # a wrong answer
    with pytest.raises(ValueError, match="turn 1 of 2"):
        sft_trace(env, 0, [sft_examples(SPLIT)[0]["completion"], "<query>SELECT 1</query>"])


def _replayed(tokenizer, trace) -> tuple[list[int], Completion]:
    """The trace's policy turns played through the rollout's own ``take_turn`` as sampled
    turns that stopped at EOS; returns the episode's prompt ids and its completion."""
    env, index = _env_of(trace)
    episode = Episode(env, index, encode_task(tokenizer, env.tasks[index]))
    env.reset(options={"index": index})
    for text in trace["completion"][::2]:
        ids = np.array(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        take_turn(tokenizer, episode, Completion(ids, np.zeros(len(ids), dtype=np.float32)))
    assert episode.done and episode.correct
    return episode.prompt_ids, episode.completion()


def test_trace_encoding_is_the_rollouts_with_its_response_mask(tokenizer, traces):
    """``encode_example`` of a trace equals the rollout's episode token for token, and its loss
    mask equals the batch's RESPONSE_MASK (observation tokens are holes)."""
    for trace in [t for t in traces if t["probe"]][:6] + [t for t in traces if not t["probe"]][:2]:
        ids, mask = encode_example(tokenizer, trace["messages"], trace["completion"])
        prompt, completion = _replayed(tokenizer, trace)
        rows = sequence_rows([prompt], [completion.token_ids], [completion.logprobs])
        assert rows[C.INPUT_IDS][0].tolist() == ids
        assert rows[C.RESPONSE_MASK][0].tolist() == mask
        holes = len(completion.token_ids) - int(completion.policy_mask.sum())
        assert (holes > 0) == (trace["probe"] is not None)
        assert mask.count(1) == int(completion.policy_mask.sum())


def test_multi_turn_share_replaces_sql_examples_by_traces():
    spec = WarmStartSpec(base="tiny-sql-math", splits=(SPLIT,), sft_steps=10, batch_size=8, multi_turn_share=0.5)
    plain = training_examples(WarmStartSpec(**{**spec.__dict__, "multi_turn_share": 0.0}))
    mixed = training_examples(spec)
    assert [e["task_id"] for e in mixed] == [e["task_id"] for e in plain]
    recast = [i for i, e in enumerate(mixed) if "probe" in e]
    assert 20 <= len(recast) <= 60
    assert all(isinstance(mixed[i]["completion"], list) for i in recast)
    assert all(mixed[i] == plain[i] for i in range(len(mixed)) if i not in recast)


def test_tiny_mt_warm_start_builds_and_resolves_by_name(tmp_path, monkeypatch):
    """``tiny-sql-math-mt`` (its spec cut to a few steps) is built from the shipped tiny model by
    the preparation step and then resolves by name; its record counts the traces it trained on."""
    assert "tiny-sql-math-mt" in BUNDLED_MODELS
    shipped = catalog.WARM_STARTS["tiny-sql-math-mt"]
    assert shipped.base == "tiny-sql-math" and 0 < shipped.multi_turn_share < 1
    monkeypatch.setenv("RLLIB_DPH_DATA", str(suite_root()))  # reuse the suite's databases
    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path))
    small = WarmStartSpec(**{**shipped.__dict__, "sft_steps": 3, "batch_size": 8, "warmup_steps": 1})
    monkeypatch.setitem(catalog.WARM_STARTS, "tiny-sql-math-mt", small)
    ref = prepare_model("tiny-sql-math-mt", progress=False)
    assert locate_model("tiny-sql-math-mt") == ref
    assert ref.kind == "bundled" and ref.location == str(tmp_path / "models" / "tiny-sql-math-mt")
    record = json.loads((tmp_path / "models" / "tiny-sql-math-mt" / catalog.BUILD_RECORD).read_text())
    assert record["sft"]["examples"] == 24 and sum(record["sft"]["multi_turn"].values()) > 0
    assert is_current(ref.location, "tiny-sql-math-mt")
    monkeypatch.setitem(catalog.WARM_STARTS, "tiny-sql-math-mt", WarmStartSpec(**{**small.__dict__, "multi_turn_share": 0.25}))
    assert not is_current(ref.location, "tiny-sql-math-mt")


def test_a_record_from_before_multi_turn_share_is_current(tmp_path, monkeypatch):
    """A warm start built before the spec had ``multi_turn_share`` (smollm2-135m-sft's) trained
    single-turn only, which is what the field's default 0.0 means: no rebuild."""
    spec = WarmStartSpec(base="tiny-random", splits=(SPLIT,), sft_steps=2, batch_size=2, warmup_steps=1)
    monkeypatch.setitem(catalog.WARM_STARTS, "tiny-old", spec)
    base = prepare_model("tiny-random", progress=False).location
    warm_start.build_warm_start("tiny-old", tmp_path / "m", base_dir=base, progress=False)
    path = tmp_path / "m" / catalog.BUILD_RECORD
    record = json.loads(path.read_text())
    del record["spec"]["multi_turn_share"]
    path.write_text(json.dumps(record))
    assert is_current(tmp_path / "m", "tiny-old")
    monkeypatch.setitem(catalog.WARM_STARTS, "tiny-old", WarmStartSpec(**{**spec.__dict__, "multi_turn_share": 0.5}))
    assert not is_current(tmp_path / "m", "tiny-old")
