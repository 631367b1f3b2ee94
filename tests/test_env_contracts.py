"""The envs' contracts under hostile input, one section per class: regexes on model output,
the episode contract, non-finite rewards, gold answers as text, answer extraction, data files,
observations in the transcript. See docs/verifiers.md."""

from __future__ import annotations

import math
import time

import pytest

from rllib_dph.envs.arguments import ArgumentError
from rllib_dph.envs.multiturn import FunctionMultiTurnEnv, tag_content


def _echo(call, truth):
    return f"you asked {call}"


def _exact(completion, truth):
    return completion.strip() == truth


def _multiturn(**kwargs):
    return FunctionMultiTurnEnv([{"q": "say ok", "answer": "ok"}], tool=_echo, verifier=_exact,
                                prompt_format="{q}", name="test/Turns-v0", **kwargs)


# ---------------------------------------------------------------------------------------------
# Regexes with super-linear time on model output
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("turn,call", [
    ("<tool>a</tool>", "a"),
    ("<tool>a</tool> then <tool> b </tool>", "b"),
    ("<tool>a</tool><tool>cut off", "a"),
    ("<tool><tool>inner</tool>", "inner"),
    ("no call", None),
    ("</tool><tool>", None),
])
def test_the_tool_call_is_the_last_complete_block(turn, call):
    assert tag_content("tool")(turn) == call


def test_many_unclosed_tags_are_read_in_linear_time():
    """200,000 unclosed tags: one pass (a non-greedy regex rescans the rest of the turn from
    each of them: 140,000 characters took 44 s)."""
    find = tag_content("query")
    start = time.monotonic()
    assert find("<query>" * 200_000) is None
    assert find("<query>" * 200_000 + "x</query>") == "x"
    assert time.monotonic() - start < 2.0


# ---------------------------------------------------------------------------------------------
# Episode contract: no step after terminated or truncated
# ---------------------------------------------------------------------------------------------

def test_a_step_after_truncation_is_refused():
    env = _multiturn(max_turns=1)
    env.reset(options={"index": 0})
    *_, terminated, truncated, info = env.step("<tool>x</tool>")
    assert (terminated, truncated) == (False, True) and "max_turns=1" in info["error"]
    with pytest.raises(RuntimeError, match="step\\(\\) after the episode ended"):
        env.step("ok")  # a final answer after the end would have scored 1
    env.reset(options={"index": 0})
    assert env.step("ok")[1] == 1.0


def test_a_step_after_the_final_answer_is_refused():
    env = _multiturn(max_turns=3, verifier_timeout_s=None)
    env.reset(options={"index": 0})
    assert env.step("<tool>x</tool>")[0] == "you asked x"
    _, reward, terminated, truncated, _ = env.step("ok")
    assert (reward, terminated, truncated) == (1.0, True, False)
    with pytest.raises(RuntimeError, match="step\\(\\) after the episode ended"):
        env.step("ok")


# ---------------------------------------------------------------------------------------------
# Non-finite rewards
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "0.1", None])
def test_a_non_finite_or_ill_typed_tool_reward_is_refused_at_construction(bad):
    with pytest.raises(ArgumentError, match="tool_reward="):
        _multiturn(tool_reward=bad)
