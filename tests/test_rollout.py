"""The rollout path gives what calling the engine and the env by hand gives."""

import numpy as np

from rllib_dph.envs.sql import SQLEnv
from rllib_dph.envs.suites import load_split
from rllib_dph.chat import encode_prompt
from rllib_dph.engines.base import SamplingParams
from rllib_dph.engines import make_engine
from rllib_dph.envs import make_env
from rllib_dph.rollout.episodes import rollout


def test_rollout_equals_engine_and_env_by_hand():
    engine = make_engine("hf", "tiny-random")
    env = SQLEnv(load_split("sql_synth/test")[:3])
    indices = [2, 0]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=7)

    groups = rollout(engine, env, indices, params).groups

    prompts = [encode_prompt(engine.tokenizer, env.tasks[i].messages) for i in indices]
    by_hand = engine.generate(prompts, params)
    assert [g.index for g in groups] == indices
    for group, prompt, completions, index in zip(groups, prompts, by_hand, indices):
        assert group.prompt_ids == prompt
        for c, expected in zip(group.completions, completions, strict=True):
            np.testing.assert_array_equal(c.token_ids, expected.token_ids)
            np.testing.assert_array_equal(c.logprobs, expected.logprobs)
        texts = [engine.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        assert group.texts == texts
        for text, reward, correct in zip(texts, group.rewards, group.correct, strict=True):
            env.reset(options={"index": index})
            _, expected_reward, _, _, info = env.step(text)
            assert reward == expected_reward and correct == info["correct"]
    assert groups[0].rewards.dtype == np.float32 and groups[0].correct.dtype == bool


def test_make_env_accepts_gymnasium_ids_and_classes():
    by_id = make_env("rllib_dph/SQL-v0", {"data": "sql_synth/test"})
    by_class = make_env(SQLEnv, {"data": "sql_synth/test"})
    assert type(by_id) is SQLEnv and type(by_class) is SQLEnv
    assert [t.id for t in by_id.tasks] == [t.id for t in by_class.tasks]
