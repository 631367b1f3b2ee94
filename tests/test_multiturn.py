"""Multi-turn verifier envs: the env contract, the SQL env's sandboxed exploratory queries, the
rollout's turns (one engine call per turn, masks with holes, budgets, reasons), the learner on
holes, D_pef rows with holes, evaluation per episode, and a user's env from `rllib train`.

The tiny model does not use any protocol well; these tests check mechanics, not learning."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from test_sql_verifier import ADVERSARIAL, TempFileWatch, make_db, sha256

import rllib_dph.envs
from rllib_dph.envs.base import Task
from rllib_dph.envs.multiturn import FunctionMultiTurnEnv
from rllib_dph.envs.sql import verify_sql
from rllib_dph.envs.sql.multiturn import SQLMultiTurnEnv
from rllib_dph.envs.suites import load_split
from rllib_dph import columns as C
from rllib_dph.rollout.batch import sequence_rows
from rllib_dph.chat import encode_prompt
from rllib_dph.algorithms.dph.pef_rows import PefRowSampler
from rllib_dph.engines import make_engine
from rllib_dph.engines.base import SamplingParams
from rllib_dph.evaluation.runner import EvalSettings, evaluate_engine
from rllib_dph.losses.advantages import group_advantages
from rllib_dph.algorithms.dph.presample import PEF_FILE, PresampleConfig, Presampler
from rllib_dph.rollout.episodes import rollout

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [t.messages[0]["content"] for t in load_split("sql_synth/test")[:6]]
JUMPY_ENV = "rllib_dph_test/Jumpy-v0"


def jumpy_call(text: str):
    """A tool call in two of three turns, by the turn's length: episodes of 1 to max_turns turns."""
    return None if len(text) % 3 == 0 else text


def count_chars(call: str, ground_truth) -> str:
    if "boom" in call:
        raise RuntimeError("the tool broke")
    return f"{len(call)} characters"


rllib_dph.envs.register_multiturn_env(
    JUMPY_ENV,
    tool=count_chars,
    verifier=lambda text, answer: "SELECT" in text,
    data=[{"question": p, "answer": ""} for p in PROMPTS],
    prompt_format="{question}",
    tool_call=jumpy_call,
    max_turns=3,
)


class TwoTurnEnv(FunctionMultiTurnEnv):
    """Every episode: a tool call in turn 1, the final answer in turn 2."""

    def tool_call(self, text):
        return text if self._turn == 1 else None


class CountingEngine:
    """The tiny model's HF engine, recording the prompts of every generate call."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.calls = engine, engine.tokenizer, []

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        return self.engine.generate(prompts, params)

    def update_weights(self, state_dict):
        self.engine.update_weights(state_dict)


@pytest.fixture(scope="module")
def engine():
    return make_engine("hf", "tiny-sql-math")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sqldb") / "music.sqlite"
    make_db(path)
    return str(path)


def sql_env(db, **kwargs) -> SQLMultiTurnEnv:
    truth = {"db_path": db, "gold_sql": "SELECT name FROM singer WHERE age > 30", "cmp_method": "bird"}
    task = Task("t0", "music", ({"role": "user", "content": "Which singers are older than 30?"},), truth)
    return SQLMultiTurnEnv([task], **kwargs)


def jumpy_env(**kwargs):
    return gym.make(JUMPY_ENV, **kwargs).unwrapped


# ---------------------------------------------------------------------------------- the env


def test_exploratory_query_rows_are_cut_to_the_row_and_character_budget(db):
    env = sql_env(db, max_observation_rows=3, max_observation_chars=1000)
    prompt, _ = env.reset(options={"index": 0})
    assert "<query>" in prompt and "3 rows" in prompt and "```sql" in prompt  # the protocol
    obs, reward, terminated, truncated, info = env.step("Look: <query>SELECT n FROM numbers</query>")
    assert obs == "0\n1\n2\n(first 3 of 200 rows)"
    assert (reward, terminated, truncated, info["turn"], info["tool_calls"]) == (0.0, False, False, 1, 1)
    env = sql_env(db, max_observation_rows=100, max_observation_chars=50)
    env.reset(options={"index": 0})
    obs = env.step("<query>SELECT n FROM numbers</query>")[0]
    assert obs.startswith("0\n1\n2\n") and obs.endswith("more characters)") and len(obs) < 50 + 40


def test_the_final_answer_is_scored_as_sql_v0(db):
    env = sql_env(db)
    env.reset(options={"index": 0})
    env.step("<query>SELECT name, age FROM singer</query>")
    answer = "```sql\nSELECT name FROM singer WHERE age > 30\n```"
    _, reward, terminated, truncated, info = env.step(answer)
    expected = verify_sql(answer, "SELECT name FROM singer WHERE age > 30", db)
    assert (reward, info["correct"], terminated, truncated) == (expected.reward, True, True, False)
    assert (info["turn"], info["tool_calls"]) == (2, 1)


@pytest.mark.parametrize(
    "turns,reward,reason",
    [
        (["I do not know."], 0.0, "no ```sql block"),  # no final answer
        (["```sql\nSELEC name FROM singer\n```"], 0.0, "syntax error"),  # malformed answer
        (["<query>SELECT 1</query>"] * 3, 0.0, "max_turns=3 reached without a final answer"),
    ],
)
def test_bad_output_ends_the_episode_with_reward_0_and_a_reason(db, turns, reward, reason):
    env = sql_env(db, max_turns=3)
    env.reset(options={"index": 0})
    for text in turns:
        _, got, terminated, truncated, info = env.step(text)
    assert terminated != truncated and got == reward and not info["correct"] and reason in info["error"]
    assert truncated == (len(turns) == 3)


def test_tool_reward_shapes_every_tool_turn(db):
    env = sql_env(db, tool_reward=-0.1)
    env.reset(options={"index": 0})
    rewards = [env.step("<query>SELECT 1</query>")[1] for _ in range(2)]
    rewards.append(env.step("```sql\nSELECT name FROM singer WHERE age > 30\n```")[1])
    assert rewards == [-0.1, -0.1, 1.0]


@pytest.mark.parametrize("sql,timeout_s,reason", ADVERSARIAL, ids=[row[0][:60] for row in ADVERSARIAL])
def test_hostile_exploratory_queries_are_contained(db, sql, timeout_s, reason):
    """The verifier's hostile-load suite, as exploratory queries: no write, no hang, no memory blow-up."""
    directory = os.path.dirname(db)
    files_before, digest_before = sorted(os.listdir(directory)), sha256(db)
    env = sql_env(db, timeout_s=timeout_s, max_observation_chars=4000)
    env.reset(options={"index": 0})
    start = time.monotonic()
    with TempFileWatch() as temp_files:
        obs, reward, terminated, truncated, _ = env.step(f"<query>{sql.format(dir=directory)}</query>")
    assert time.monotonic() - start < min(timeout_s, 5.0) + 1.0
    assert not temp_files.seen
    assert obs.startswith("error: ") and reason in obs and not (terminated or truncated) and reward == 0.0
    assert sha256(db) == digest_before and sorted(os.listdir(directory)) == files_before
    assert env.step("<query>SELECT count(*) FROM singer</query>")[0] == "5\n(1 rows)"  # still usable


def test_a_tool_that_raises_answers_with_its_error():
    env = jumpy_env()
    env.reset(options={"index": 0})
    obs, _, terminated, truncated, _ = env.step("boom")
    assert obs == "error: RuntimeError: the tool broke" and not (terminated or truncated)


def test_bad_turn_settings_are_named(db):
    with pytest.raises(ValueError, match="max_turns=0 must be >= 1"):
        sql_env(db, max_turns=0)
    with pytest.raises(ValueError, match="max_observation_rows=0 must be >= 1"):
        sql_env(db, max_observation_rows=0)


# ---------------------------------------------------------------------------------- the rollout


def observation_holes(completion) -> np.ndarray:
    return ~completion.policy_mask


def test_one_engine_call_per_turn_for_the_episodes_still_running(engine):
    counting = CountingEngine(engine)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=3)
    groups = rollout(counting, jumpy_env(), [0, 1, 2], params).groups
    turns = np.concatenate([g.turns for g in groups])
    assert 1 < turns.max() <= 3 and turns.min() < turns.max()  # episodes of different lengths
    assert len(counting.calls) == turns.max()
    first_prompts, first_params = counting.calls[0]
    assert first_params.n == 4 and len(first_prompts) == 3  # turn 1: n episodes share each prompt
    for t, (prompts, turn_params) in enumerate(counting.calls[1:], start=2):
        assert turn_params.n == 1 and turn_params.seed != params.seed
        assert len(prompts) == int((turns >= t).sum())  # finished episodes left the batch
    episodes = [(g, c) for g in groups for c in g.completions]
    longest = [(g, c) for (g, c), n in zip(episodes, turns) if n == turns.max()]
    for g, c in longest:  # a last-turn prompt is a running episode's whole sequence so far
        last = int(np.flatnonzero(observation_holes(c)).max()) + 1  # through the last observation
        assert g.prompt_ids + c.token_ids[:last].tolist() in counting.calls[-1][0]


def test_episode_sequences_are_the_chat_template_rendering_with_observation_holes(engine):
    groups = rollout(engine, jumpy_env(), [0, 1], SamplingParams(n=3, max_new_tokens=12, seed=5)).groups
    tok = engine.tokenizer
    multi = [(g, c, n) for g in groups for c, n in zip(g.completions, g.turns) if n > 1]
    assert multi
    for group, c, num_turns in multi:
        holes = observation_holes(c)
        assert np.isnan(c.logprobs[holes]).all() and (c.logprobs[~holes] <= 0).all()
        runs = np.flatnonzero(np.diff(np.concatenate([[0], holes.astype(int), [0]])))
        assert len(runs) // 2 == num_turns - 1  # one observation between two turns
        turns = np.split(c.token_ids, runs)[0::2]
        messages = [{"role": "user", "content": PROMPTS[group.index]}]
        for turn, observation in zip(turns, np.split(c.token_ids, runs)[1::2]):
            messages.append({"role": "assistant", "content": tok.decode(turn, skip_special_tokens=True)})
            text = tok.decode(observation, skip_special_tokens=True).strip()
            assert re.fullmatch(r"user\n\d+ characters\nassistant", text)
            messages.append({"role": "user", "content": text.split("\n")[1]})
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prefix = group.prompt_ids + c.token_ids[: runs[-1]].tolist()
        assert tok.decode(prefix) == rendered  # turns closed by EOS render exactly as the template


def test_mu_of_later_turns_is_the_policy_given_the_observations(engine):
    """μ of every sampled token equals a teacher-forced forward over prompt + turns + observations."""
    groups = rollout(engine, jumpy_env(), [0, 1], SamplingParams(n=2, max_new_tokens=10, seed=1)).groups
    rows = [(g.prompt_ids, c) for g in groups for c in g.completions]
    batch = sequence_rows([p for p, _ in rows], [c.token_ids for _, c in rows], [c.logprobs for _, c in rows])
    mask = batch[C.RESPONSE_MASK].astype(bool)
    after_prompt = np.arange(mask.shape[1])[None] >= batch[C.PROMPT_LENGTH][:, None]  # (B, L)
    holes = (batch[C.ATTENTION_MASK] == 1) & ~mask & after_prompt
    assert holes.any() and np.isfinite(batch[C.BEHAVIOR_LOGP]).all()
    assert mask.sum() == sum(int(c.policy_mask.sum()) for _, c in rows)
    assert (batch[C.BEHAVIOR_LOGP][holes] == 0).all()
    ids = torch.as_tensor(batch[C.INPUT_IDS])
    with torch.no_grad():
        logits = engine.model(input_ids=ids, attention_mask=torch.as_tensor(batch[C.ATTENTION_MASK])).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]  # (B, L-1)
    np.testing.assert_allclose(logp.numpy()[mask[:, 1:]], batch[C.BEHAVIOR_LOGP][mask], atol=1e-4)


def test_token_budget_truncates_episodes_with_a_reason(engine):
    env = jumpy_env(max_episode_tokens=20)
    groups = rollout(engine, env, [0, 1, 2], SamplingParams(n=3, max_new_tokens=12, seed=2)).groups
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    reasons = [r for g in groups for r in g.reasons]
    assert max(lengths) <= 20
    assert "max_episode_tokens=20 reached without a final answer" in reasons
    for g in groups:
        for reason, reward, correct in zip(g.reasons, g.rewards, g.correct):
            if reason is not None and "max_episode_tokens" in reason:
                assert reward == 0.0 and not correct


def test_an_engine_context_length_ends_episodes_instead_of_failing(engine):
    counting = CountingEngine(engine)
    params = SamplingParams(n=3, max_new_tokens=12, seed=2)
    prompts = [len(encode_prompt(engine.tokenizer, [{"role": "user", "content": p}])) for p in PROMPTS[:3]]
    counting.max_model_len = max(prompts) + 12 + 16  # room for the first turn, not for many more
    groups = rollout(counting, jumpy_env(), [0, 1, 2], params).groups
    assert all(len(p) + 12 <= counting.max_model_len for prompts, _ in counting.calls for p in prompts)
    reasons = [r for g in groups for r in g.reasons]
    assert f"the next turn's prompt would pass the engine's context ({max(prompts) + 16} tokens)" in reasons


def test_max_turns_truncation_and_single_turn_is_one_call(engine):
    groups = rollout(engine, jumpy_env(max_turns=1), [0, 1], SamplingParams(n=3, max_new_tokens=8, seed=4)).groups
    tool_turns = [(r, n) for g in groups for r, n in zip(g.reasons, g.turns)]
    assert all(n == 1 for _, n in tool_turns)
    assert any(r == "max_turns=1 reached without a final answer" for r, _ in tool_turns)
    counting = CountingEngine(engine)
    sql = gym.make("rllib_dph/SQL-v0", data="sql_synth/test").unwrapped
    groups = rollout(counting, sql, [0, 1], SamplingParams(n=2, max_new_tokens=8, seed=4)).groups
    assert len(counting.calls) == 1 and all((g.turns == 1).all() and (g.tool_calls == 0).all() for g in groups)
    assert all(c.policy_mask.all() for g in groups for c in g.completions)


# ---------------------------------------------------------------------------------- algorithms


@pytest.fixture
def multiturn_config(tiny_grpo_config):
    return (
        tiny_grpo_config.copy(copy_frozen=False)
        .environment(JUMPY_ENV, env_config={"max_turns": 3})
        .llm(model_name="tiny-sql-math", max_response_length=10)
        .training(trust_region="dppo_topk_kl", rollout_top_k=3, kl_coeff=0.1, group_size=3)
    )


def test_learner_sees_only_policy_tokens(multiturn_config):
    """Episodes are rows, groups are a prompt's episodes; at step 0 π_θ = μ on every token the
    loss, trust region and KL see: observation tokens (μ 0 in the batch) would break that."""
    from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner

    runner = LLMEnvRunner(config=multiturn_config)
    batch = runner.sample(num_prompts=3)
    assert (batch[C.ATTENTION_MASK].sum(1) - batch[C.PROMPT_LENGTH] > batch[C.RESPONSE_MASK].sum(1)).any()
    assert len(batch[C.REWARDS]) == 9 and len(np.unique(batch[C.GROUP_IDS])) == 3
    assert runner.get_metrics()["turns_per_episode"] > 1
    batch[C.REWARDS] = np.random.default_rng(0).integers(0, 2, 9).astype(np.float32)
    batch[C.ADVANTAGES] = group_advantages(torch.as_tensor(batch[C.REWARDS]), torch.as_tensor(batch[C.GROUP_IDS])).numpy()
    learner = multiturn_config.build_learner(env=runner.env)
    logged = learner.update(
        batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=9), num_epochs=1, minibatch_size=9
    )[DEFAULT_MODULE_ID]
    assert logged["abs_prob_diff_max"].peek() < 1e-4 and logged["clip_fraction"].peek() == 0.0
    assert logged["num_exploration_tokens"].peek() == batch[C.RESPONSE_MASK].sum()


def test_presampled_d_pef_rows_hold_multiturn_episodes_with_ref_logp_on_policy_tokens(engine, tmp_path):
    env = TwoTurnEnv([{"question": p, "answer": ""} for p in PROMPTS[:3]], tool=count_chars,
                     verifier=lambda text, answer: True, prompt_format="{question}")
    config = PresampleConfig(model_name="tiny-sql-math", env="unused", out_dir=str(tmp_path), k=2,
                             min_correct=1, pef_samples=1, sampling=SamplingParams(max_new_tokens=8))
    Presampler(config, engine=engine, env=env).run(progress=False)
    table = pq.read_table(tmp_path / PEF_FILE).to_pylist()
    assert len(table) == 3
    for row in table:
        ref = np.array(row["ref_logp"], dtype=np.float32)
        assert np.isnan(ref).any() and (ref[~np.isnan(ref)] <= 0).all()
        assert "characters" in engine.tokenizer.decode(row["response_ids"])
    rows = PefRowSampler(str(tmp_path / PEF_FILE)).take(3)
    mask = rows[C.RESPONSE_MASK].astype(bool)
    assert np.isfinite(rows[C.REF_LOGP]).all() and (rows[C.REF_LOGP][~mask] == 0).all()
    assert mask.sum() == sum(int((~np.isnan(np.array(r["ref_logp"], dtype=np.float32))).sum()) for r in table)


def test_evaluation_is_per_episode_and_reports_turns_and_tool_use(engine):
    env = jumpy_env()
    result = evaluate_engine(engine, env, EvalSettings(sampling=SamplingParams(n=3, max_new_tokens=10), limit=3, greedy=False))
    turns = [t for r in result.records for t in r.turns]
    assert len(turns) == 9 and all(1 <= t <= 3 for t in turns)
    summary = result.summary()
    assert summary["turns_per_episode"] == pytest.approx(np.mean(turns))
    tool_calls = [c for r in result.records for c in r.tool_calls]
    assert summary["tool_use_share"] == pytest.approx(np.mean([c > 0 for c in tool_calls]))
    assert {"turns_per_episode", "tool_use_share", "pass@1", "pass@3"} <= set(result.flat_metrics())


# ---------------------------------------------------------------------------------- your own env


def docs_snippet() -> str:
    text = (REPO / "docs" / "multiturn.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)


def test_the_docs_env_is_at_most_20_lines_and_trains_from_the_command_line(tmp_path):
    snippet = docs_snippet()
    assert len(snippet.strip().splitlines()) <= 20
    (tmp_path / "mymodule.py").write_text(snippet)
    env_id = re.search(r'"(myorg/[^"]+)"', snippet).group(1)
    cmd = [
        sys.executable, "-m", "rllib_dph.cli", "train", "--algo", "GRPO", "--env", env_id, "--import", "mymodule",
        "--config", json.dumps({"model_name": "tiny-sql-math", "max_response_length": 12, "group_size": 2,
                                "prompts_per_step": 2, "num_env_runners": 0}),
        "--stop", json.dumps({"training_iteration": 1}), "--storage-path", "runs", "--name", "mine",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert [line.split()[:2] for line in out.stdout.splitlines() if line.startswith("iter")] == [["iter", "1"]]


@pytest.mark.vllm
def test_vllm_engine_runs_multiturn_episodes():
    pytest.importorskip("vllm")
    vllm_engine = make_engine("vllm", "tiny-sql-math", max_model_len=1024, kv_cache_memory_bytes=256 << 20)
    counting = CountingEngine(vllm_engine)
    groups = rollout(counting, jumpy_env(), [0, 1, 2], SamplingParams(n=3, max_new_tokens=12, seed=3)).groups
    turns = np.concatenate([g.turns for g in groups])
    assert len(counting.calls) == turns.max() > 1
    for g in groups:
        for c, n in zip(g.completions, g.turns):
            assert int(np.isnan(c.logprobs).any()) == int(n > 1)
            prompt = encode_prompt(vllm_engine.tokenizer, [{"role": "user", "content": PROMPTS[g.index]}])
            assert g.prompt_ids == prompt
