"""rllib_dph/Verifiers-v0: environments written for verifiers (classic API) run unchanged as
verifier envs: single-turn with a parser and async reward functions, multi-turn with
env_response and stop conditions, and the features that do not map (a clear error, never a
silent reward). The environments are defined here. Needs the optional extra."""

import asyncio
import math
import time

import numpy as np
import pytest

vf = pytest.importorskip("verifiers", reason='needs verifiers: pip install -e ".[verifiers]"')
if not hasattr(vf, "SingleTurnEnv"):
    pytest.skip('needs verifiers\' classic API (0.3.x): pip install -e ".[verifiers]"', allow_module_level=True)

import gymnasium as gym  # noqa: E402
from datasets import Dataset  # noqa: E402 - a dependency of verifiers

import rllib_dph.envs  # noqa: E402,F401
from rllib_dph.chat import encode_prompt  # noqa: E402
from rllib_dph.engines.base import Completion, SamplingParams  # noqa: E402
from rllib_dph.envs.adapters.verifiers import VerifiersEnv  # noqa: E402
from rllib_dph.models.hub import load_tokenizer  # noqa: E402
from rllib_dph.rollout.episodes import rollout  # noqa: E402

QUESTIONS = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 3 * 3?", "answer": "9"}]


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    """verifiers envs built in a test install SIGINT / SIGTERM handlers: other tests keep theirs."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


# ----------------------------------------------------------------------------- the envs, as written for verifiers
def load_environment(**kwargs):
    """A single-turn arithmetic env, as a verifiers environment module writes it."""
    parser = vf.XMLParser(["answer"], answer_field="answer")

    async def correct_answer(completion, answer, parser, **_):  # async, as verifiers envs often are
        await asyncio.sleep(0)
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), system_prompt="Reply in <answer> tags.",
                            parser=parser, rubric=rubric, **kwargs)


class GuessEnv(vf.MultiTurnEnv):
    """Guess the number: the env answers "higher" / "lower" until the guess is right."""

    async def setup_state(self, state, **kwargs):
        state["guesses"] = 0
        return state

    @vf.stop
    async def solved(self, state, **kwargs) -> bool:
        return state.get("solved", False)

    async def env_response(self, messages, state, **kwargs):
        guess = self.parser.parse_answer(messages)
        state["guesses"] += 1
        target = int(state["answer"])
        if guess is None or not guess.strip().isdigit():
            return [{"role": "user", "content": "Write your guess as <guess>N</guess>."}]
        if int(guess) == target:
            state["solved"] = True
            state["final_env_response"] = [{"role": "user", "content": "Correct!"}]  # ends the rollout
            return state["final_env_response"]
        return [{"role": "user", "content": "higher" if int(guess) < target else "lower"}]


def guess_env(max_turns=4, **kwargs):
    parser = vf.XMLParser(["guess"], answer_field="guess")

    def solved(state, **_):
        return 1.0 if state.get("solved") else 0.0

    def fewer_guesses(state, **_):
        return 1.0 / max(1, state["guesses"])

    data = Dataset.from_list([{"question": "Guess my number from 1 to 10.", "answer": "7"}])
    return GuessEnv(dataset=data, parser=parser, rubric=vf.Rubric(funcs=[solved, fewer_guesses], weights=[1.0, 0.0]),
                    max_turns=max_turns, **kwargs)


def play(env, turns, index=0):
    obs, info = env.reset(options={"index": index})
    out = []
    for turn in turns:
        out.append(env.step(turn))
        if out[-1][2] or out[-1][3]:
            break
    return obs, out


# ----------------------------------------------------------------------------- single turn
def test_single_turn_env_prompt_reward_metrics_and_correct():
    env = VerifiersEnv(load_environment())
    assert [t.messages for t in env.tasks][0] == (
        {"role": "system", "content": "Reply in <answer> tags."}, {"role": "user", "content": "What is 2 + 2?"})
    obs, steps = play(env, ["<answer>\n4\n</answer>"])
    assert obs == "Reply in <answer> tags.\n\nWhat is 2 + 2?"
    _, reward, terminated, truncated, info = steps[0]
    assert terminated and not truncated and info["correct"] and "error" not in info
    assert reward == pytest.approx(1.2) and info["metrics"]["correct_answer"] == 1.0
    _, steps = play(env, ["<answer>\n5\n</answer>"])
    assert steps[0][1] == pytest.approx(0.2) and not steps[0][4]["correct"]  # format only: below pass_threshold 0.5
    _, steps = play(env, ["four"], index=1)
    assert steps[0][1] < 0.5 and not steps[0][4]["correct"]
    strict = VerifiersEnv(load_environment(), correct_threshold=1.2)
    assert play(strict, ["<answer>\n4\n</answer>"])[1][0][4]["correct"]


def test_gym_make_loads_the_environment_module_by_id():
    import signal

    before = signal.getsignal(signal.SIGTERM)
    env = gym.make("rllib_dph/Verifiers-v0", environment="test_verifiers_adapter").unwrapped
    assert signal.getsignal(signal.SIGTERM) is before  # verifiers' handler (teardown, exit) is not kept
    assert len(env.tasks) == 2 and env.tasks[1].id.endswith("/train/1")
    assert play(env, ["<answer>\n9\n</answer>"], index=1)[1][0][1] == pytest.approx(1.2)


def test_rollout_scores_a_group_of_episodes_through_the_env():
    env = VerifiersEnv(load_environment())
    tokenizer = load_tokenizer("tiny-random")
    texts = ["<answer>\n4\n</answer>", "<answer>\n5\n</answer>", "no tags", "<answer>\n4\n</answer>"]

    class Engine:
        def __init__(self):
            self.tokenizer = tokenizer

        def generate(self, prompts, params):
            ids = [np.array(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
            return [[Completion(token_ids=i, logprobs=np.zeros(len(i), dtype=np.float32)) for i in ids]] * len(prompts)

    prompt = encode_prompt(tokenizer, [dict(m) for m in env.tasks[0].messages])
    group = rollout(Engine(), env, [0], SamplingParams(n=4), prompt_ids=[prompt]).groups[0]
    assert group.correct.tolist() == [True, False, False, True]
    by_step = [play(env, [t])[1][0][1] for t in texts]
    assert group.rewards == pytest.approx(by_step) and by_step[:2] == pytest.approx([1.2, 0.2])


# ----------------------------------------------------------------------------- multi turn
def test_multi_turn_env_response_observations_and_stop_condition():
    env = VerifiersEnv(guess_env())
    assert env.max_turns == 4  # the env's own
    _, steps = play(env, ["<guess>3</guess>", "<guess>9</guess>", "<guess>7</guess>"])
    assert [s[0] for s in steps[:2]] == ["higher", "lower"]
    assert [(s[1], s[2], s[3]) for s in steps[:2]] == [(0.0, False, False)] * 2
    _, reward, terminated, truncated, info = steps[2]
    assert terminated and not truncated and reward == 1.0 and info["correct"]
    assert info["stop_condition"] in ("solved", "has_final_env_response")
    assert info["metrics"]["fewer_guesses"] == pytest.approx(1 / 3)
    assert info["turn"] == 3
    # the env's own max_turns ends the episode, scored by its rubric
    _, steps = play(env, ["<guess>1</guess>"] * 5)
    assert len(steps) == 4 and steps[-1][2] and steps[-1][1] == 0.0
    assert steps[-1][4]["stop_condition"] == "max_turns_reached" and not steps[-1][4]["correct"]


def test_a_lower_turn_cap_truncates_with_the_reason():
    env = VerifiersEnv(guess_env(max_turns=-1), max_turns=2)  # the env sets no limit
    _, steps = play(env, ["<guess>1</guess>"] * 3)
    assert len(steps) == 2 and steps[-1][3] and steps[-1][1] == 0.0
    assert steps[-1][4]["error"] == "max_turns=2 reached without the env ending the episode"
    assert VerifiersEnv(guess_env(max_turns=-1)).max_turns == 8


def test_a_step_after_the_end_is_refused_until_the_next_reset():
    env = VerifiersEnv(load_environment())
    _, steps = play(env, ["<answer>\n4\n</answer>"])
    assert steps[0][2] and steps[0][1] == pytest.approx(1.2)
    with pytest.raises(RuntimeError, match="step\\(\\) after the episode ended"):
        env.step("<answer>\n4\n</answer>")  # the same reward again, after terminated
    truncated = VerifiersEnv(guess_env(max_turns=-1), max_turns=1)
    assert play(truncated, ["<guess>1</guess>"])[1][-1][3]
    with pytest.raises(RuntimeError, match="step\\(\\) after the episode ended"):
        truncated.step("<guess>7</guess>")
    assert play(env, ["<answer>\n4\n</answer>"])[1][0][1] == pytest.approx(1.2)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_rubric_reward_scores_zero_with_the_reason(bad):
    def poisoned(completion, answer, **_):
        return bad

    env = VerifiersEnv(vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), rubric=vf.Rubric(funcs=[poisoned])))
    _, steps = play(env, ["4"])
    assert steps[0][1] == 0.0 and not steps[0][4]["correct"]
    assert f"the rubric's reward is {bad!r}; scored 0" in steps[0][4]["error"]


# ----------------------------------------------------------------------------- what does not map, and failures
def test_a_reward_function_that_raises_is_an_error_not_a_silent_zero():
    def broken(completion, answer, **_):
        raise KeyError("gold")

    env = VerifiersEnv(vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), rubric=vf.Rubric(funcs=[broken])))
    _, steps = play(env, ["4"])
    assert steps[0][1] == 0.0 and not steps[0][4]["correct"]
    assert "Error calling reward function broken" in steps[0][4]["error"]


def test_features_that_do_not_map_raise_when_built():
    data = Dataset.from_list(QUESTIONS)

    def diverse(completions, **_) -> list[float]:  # a group reward function
        return [1.0] * len(completions)

    with pytest.raises(ValueError, match="group reward functions"):
        VerifiersEnv(vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[diverse])))

    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    with pytest.raises(ValueError, match=r"declares tools \['add'\] for native tool calls"):
        VerifiersEnv(vf.ToolEnv(dataset=data, tools=[add]))
    with pytest.raises(ValueError, match="score_rollouts=False"):
        VerifiersEnv(vf.SingleTurnEnv(dataset=data, score_rollouts=False))
    with pytest.raises(TypeError, match="give a verifiers Environment"):
        VerifiersEnv(object())


def test_env_errors_and_hangs_end_the_episode_with_reward_zero():
    class Raises(GuessEnv):
        async def env_response(self, messages, state, **kwargs):
            raise RuntimeError("database is gone")

    class Hangs(GuessEnv):
        async def env_response(self, messages, state, **kwargs):
            await asyncio.sleep(3600)

    data = Dataset.from_list([{"question": "Guess.", "answer": "7"}])
    raises = VerifiersEnv(Raises(dataset=data, max_turns=3))
    _, steps = play(raises, ["<guess>1</guess>"])
    assert steps[0][1] == 0.0 and steps[0][2] and "raised RuntimeError: database is gone" in steps[0][4]["error"]
    hangs = VerifiersEnv(Hangs(dataset=data, max_turns=3), verifier_timeout_s=0.5)
    _, steps = play(hangs, ["<guess>1</guess>"])
    assert steps[0][1] == 0.0 and steps[0][4]["error"] == "verifiers env timed out after 0.5 s (verifier_timeout_s)"
    env = VerifiersEnv(guess_env())
    assert play(env, ["<guess>7</guess>"])[1][0][1] == 1.0  # the loop still serves other episodes
    timed = VerifiersEnv(guess_env(timeout_seconds=0.2))
    timed.reset(options={"index": 0})
    time.sleep(0.5)  # the env's own wall clock runs while the policy generates
    _, reward, terminated, _, info = timed.step("<guess>7</guess>")
    assert terminated and not info["correct"] and "timeout_seconds=0.2 ended the rollout" in info["error"]


def test_grpo_trains_one_iteration_on_a_verifiers_env(tiny_grpo_config, ray_session):
    config = tiny_grpo_config.environment("rllib_dph/Verifiers-v0")
    config.env_config = {"environment": "test_verifiers_adapter"}  # environment() would merge the SQL env's
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    assert 0.0 <= result["env_runners"]["reward_mean"] <= 1.2
