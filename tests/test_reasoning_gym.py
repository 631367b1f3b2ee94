"""rllib_dph/ReasoningGym-v0: reasoning-gym data sets as verifier envs (prompts, the data set's own
scorer on the extracted answer, disjoint splits, the time limit, bad answers) and countdown's
solution styles in evaluation. Needs the optional extra."""

import time

import numpy as np
import pytest

pytest.importorskip("reasoning_gym", reason='needs reasoning-gym: pip install -e ".[reasoning-gym]"')

import gymnasium as gym  # noqa: E402

import rllib_dph.envs  # noqa: E402,F401
from rllib_dph.chat import encode_prompt  # noqa: E402
from rllib_dph.engines.base import Completion, SamplingParams  # noqa: E402
from rllib_dph.envs.reasoning_gym import (  # noqa: E402
    ReasoningGymEnv,
    countdown_shape,
    countdown_style,
    generate_items,
)
from rllib_dph.evaluation import EvalSettings, evaluate_engine, pass_at_k  # noqa: E402
from rllib_dph.models.hub import load_tokenizer  # noqa: E402

ENV_ID = "rllib_dph/ReasoningGym-v0"
#: Small countdown tasks: 3 numbers, fast to generate.
COUNTDOWN = {"min_numbers": 3, "max_numbers": 3}


def step(env, index, text):
    env.reset(options={"index": index})
    _, reward, terminated, truncated, info = env.step(text)
    assert terminated and not truncated
    return reward, info


@pytest.fixture(scope="module")
def countdown():
    return gym.make(ENV_ID, dataset="countdown", config=COUNTDOWN, size=4, seed=0).unwrapped


def test_prompt_is_the_question_with_reasoning_gyms_system_prompt(countdown):
    import reasoning_gym
    from reasoning_gym.utils import SYSTEM_PROMPTS

    entry = reasoning_gym.create_dataset("countdown", seed=0, size=4, **COUNTDOWN)[2]
    task = countdown.tasks[2]
    assert task.messages == ({"role": "system", "content": SYSTEM_PROMPTS["default"]},
                             {"role": "user", "content": entry["question"]})
    assert "Final answer format instructions" in entry["question"]  # the data set's own instructions
    assert task.id == "countdown/train/s0/2" and task.data_source == "reasoning_gym/countdown"
    obs, info = countdown.reset(options={"index": 2})
    assert obs == task.prompt_text and info["messages"][1]["content"] == entry["question"]
    plain = ReasoningGymEnv("countdown", config=COUNTDOWN, size=1, system_prompt=None)
    assert [m["role"] for m in plain.tasks[0].messages] == ["user"]


@pytest.mark.parametrize("dataset", ["countdown", "chain_sum", "basic_arithmetic", "leg_counting", "word_sorting"])
def test_the_reference_answer_in_answer_tags_gets_full_credit(dataset):
    env = ReasoningGymEnv(dataset, size=3, seed=1)
    for i, task in enumerate(env.tasks):
        reward, info = step(env, i, f"Thinking...\n<answer>{task.ground_truth['answer']}</answer>")
        assert reward == 1.0 and info["correct"] and "error" not in info


def test_partial_credit_is_the_reward_and_the_threshold_says_correct(countdown):
    entry = countdown.tasks[0].ground_truth
    numbers = entry["metadata"]["numbers"]
    wrong_numbers = f"<answer>{numbers[0]} + {numbers[1]}</answer>"  # countdown's scorer: 0.05
    reward, info = step(countdown, 0, wrong_numbers)
    assert reward == pytest.approx(0.05) and not info["correct"] and "error" not in info
    lenient = ReasoningGymEnv("countdown", config=COUNTDOWN, size=4, seed=0, correct_threshold=0.05)
    assert step(lenient, 0, wrong_numbers)[1]["correct"]
    with pytest.raises(ValueError, match="correct_threshold=0 is outside"):
        ReasoningGymEnv("countdown", config=COUNTDOWN, size=1, correct_threshold=0)


def test_bad_answers_score_zero_with_the_reason_and_never_raise(countdown):
    reward, info = step(countdown, 0, "I think it is 42.")
    assert reward == 0.0 and not info["correct"] and info["error"] == "no <answer>...</answer> block in the completion"
    reward, info = step(countdown, 0, "<answer>__import__('os').getpid()</answer>")
    assert reward == 0.0 and "is not an arithmetic expression" in info["error"]
    for text in ["<answer></answer>", "<answer>((((1</answer>", "<answer>" + "(" * 5000 + "</answer>", "\x00<answer>\ud800</answer>"]:
        reward, info = step(countdown, 1, text)
        assert reward <= 0.01 and not info["correct"]


def test_a_scorer_past_the_time_limit_scores_zero_and_the_next_answer_is_scored():
    env = ReasoningGymEnv("countdown", config=COUNTDOWN, size=2, seed=0, verifier_timeout_s=1.0)
    reward, info = step(env, 0, "<answer>9**9**9**9</answer>")  # sympy computes a huge power
    assert reward == 0.0 and info["error"] == "verifier timed out after 1 s (verifier_timeout_s)"
    gold = env.tasks[1].ground_truth["answer"]
    assert step(env, 1, f"<answer>{gold}</answer>")[0] == 1.0  # a fresh scoring process


def test_a_scorer_error_scores_zero_with_its_message():
    from rllib_dph.envs.reasoning_gym import score_completion

    verdict = score_completion("<answer>1</answer>", {}, dataset="no_such", scorer_kwargs={}, correct_threshold=1.0)
    assert (verdict.reward, verdict.correct) == (0.0, False)
    assert verdict.error.startswith("score_answer raised ValueError: Dataset 'no_such' not registered")


def test_train_and_test_splits_share_no_question():
    import reasoning_gym

    # 2-number countdown over small values: few distinct questions, so seeds collide
    config = {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 6, "min_target": 1, "max_target": 40}
    train = ReasoningGymEnv("countdown", config=config, size=60, seed=3)
    test = ReasoningGymEnv("countdown", config=config, size=20, seed=3, split="test", train_size=60)
    train_questions = {t.ground_truth["question"] for t in train.tasks}
    assert not train_questions & {t.ground_truth["question"] for t in test.tasks}
    assert len(test.tasks) == 20 and all(t.id.startswith("countdown/test/s3/") for t in test.tasks)
    # without the check, the test seed's items do repeat train questions: the check removed them
    raw = reasoning_gym.create_dataset("countdown", seed=3 + 2**31, size=80, **config)
    kept = [t.meta["source_index"] for t in test.tasks]
    dropped = [i for i in range(kept[-1]) if i not in kept]
    assert dropped and all(raw[i]["question"] in train_questions for i in dropped)
    with pytest.raises(ValueError, match="found only .* questions outside the 60 train questions"):
        generate_items("countdown", {**config, "max_value": 2, "max_target": 4}, size=30, seed=3, split="test",
                       train_size=60)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="dataset='no_such' is not a reasoning-gym data set"):
        ReasoningGymEnv("no_such")
    with pytest.raises(ValueError, match="sets seed or size"):
        ReasoningGymEnv("countdown", config={"seed": 1})
    with pytest.raises(ValueError, match="split='dev'"):
        ReasoningGymEnv("countdown", config=COUNTDOWN, split="dev")
    with pytest.raises(ValueError, match="refused by reasoning-gym: AssertionError: min_numbers must be greater than 1"):
        ReasoningGymEnv("countdown", config={"min_numbers": 1})


def test_countdown_shapes():
    assert countdown_shape("94*4 - 61 - 6", [94, 4, 61, 6]) == ("*--", 0, "given")
    assert countdown_shape("(6 + 61) * 4 - 94", [94, 4, 61, 6]) == ("+*-", 1, "mixed")
    assert countdown_shape("6 + 4 + 61 + 94", [94, 4, 61, 6]) == ("+++", 0, "mixed")
    assert countdown_shape("4 + 6 + 61 + 94", [94, 4, 61, 6]) == ("+++", 0, "ascending")
    assert countdown_shape("94 + 61 + (6 - 4)", [94, 4, 61, 6]) == ("++-", 1, "descending")
    assert countdown_shape("2**3", [2, 3]) == ("^", 0, "given")
    for bad in ["x + 1", "(1 + 2", "", "1 = 1", "1" * 600]:
        assert countdown_shape(bad, [1, 2]) is None


def test_countdown_style_in_evaluation(countdown):
    tokenizer = load_tokenizer("tiny-random")
    tasks = countdown.tasks[:2]
    golds = [t.ground_truth["answer"] for t in tasks]
    samples = [
        [f"<answer>{golds[0]}</answer>", f"<answer>{golds[0].replace('*', ' * ')}</answer>", "no tags", "<answer>1</answer>"],
        ["<answer>(1</answer>", f"<answer>{golds[1]}</answer>", f"<answer>{golds[1]}</answer>", "<answer>1+1</answer>"],
    ]
    script = {tuple(encode_prompt(tokenizer, [dict(m) for m in t.messages])): s for t, s in zip(tasks, samples)}

    class Engine:
        def __init__(self):
            self.tokenizer = tokenizer

        def generate(self, prompts, params):
            out = []
            for p in prompts:
                ids = [np.array(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in script[tuple(p)][: params.n]]
                out.append([Completion(token_ids=i, logprobs=np.zeros(len(i), dtype=np.float32)) for i in ids])
            return out

    settings = EvalSettings(sampling=SamplingParams(n=4), greedy=False, limit=2)
    result = evaluate_engine(Engine(), countdown, settings)
    assert [r.correct for r in result.records] == [[True, True, False, False], [False, True, True, False]]
    style0 = countdown_style(samples[0][0], tasks[0])
    assert result.records[0].styles == [style0, style0, "none", countdown_style(samples[0][3], tasks[0])]
    summary = result.summary()
    style1 = countdown_style(samples[1][1], tasks[1])
    by_style = {style0: [2, 0], style1: [0, 2]} if style1 != style0 else {style0: [2, 2]}  # correct samples per prompt
    for style, counts in by_style.items():
        assert summary[f"pass@1/{style}"] == pytest.approx(sum(pass_at_k(4, c, 1) for c in counts) / 2)
    # spacing is one solution: each prompt has one distinct correct answer
    assert summary["distinct_correct@4"] == pytest.approx(1.0)
    # the same style function given by the user reproduces the env's own styles
    mine = evaluate_engine(Engine(), countdown, EvalSettings(sampling=SamplingParams(n=4), greedy=False, limit=2,
                                                             style_fn=countdown_style))
    assert [r.styles for r in mine.records] == [r.styles for r in result.records]
    with pytest.raises(ValueError, match="has no countdown numbers"):
        countdown_style("<answer>1+2</answer>", ReasoningGymEnv("chain_sum", size=1).tasks[0])


def test_data_keeps_the_tasks_a_file_names_and_refuses_other_prompts(tmp_path, countdown):
    """DPH samples its exploration prompts from d_exp.parquet through env_config["data"]."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": t.id, "data_source": t.data_source, "prompt": [dict(m) for m in t.messages],
             "reward_model": {"style": "rule", "ground_truth": {"answer": t.ground_truth["answer"]}}}
            for t in (countdown.tasks[3], countdown.tasks[1])]
    path = tmp_path / "d_exp.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    env = gym.make(ENV_ID, dataset="countdown", config=COUNTDOWN, size=4, seed=0, data=str(path)).unwrapped
    assert [t.id for t in env.tasks] == [countdown.tasks[1].id, countdown.tasks[3].id]
    assert env.tasks[0].ground_truth == countdown.tasks[1].ground_truth  # the env's own entry, not the file's
    reward, info = step(env, 0, f"<answer>{countdown.tasks[1].ground_truth['answer']}</answer>")
    assert reward == 1.0 and info["correct"]
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({**rows[0], "prompt": [{"role": "user", "content": "another question"}]}) + "\n")
    with pytest.raises(ValueError, match="row 0 .*another prompt"):
        gym.make(ENV_ID, dataset="countdown", config=COUNTDOWN, size=4, seed=0, data=str(other))
    stranger = tmp_path / "stranger.jsonl"
    stranger.write_text(json.dumps({**rows[0], "id": "countdown/train/s9/0"}) + "\n")
    with pytest.raises(ValueError, match="names task 'countdown/train/s9/0'"):
        gym.make(ENV_ID, dataset="countdown", config=COUNTDOWN, size=4, seed=0, data=str(stranger))


def test_the_answer_block_is_read_in_linear_time_as_reasoning_gym_reads_it():
    """reasoning-gym's own extract_answer rescans the rest of the text from each unclosed
    <answer> (80,000 characters of them took 30 s); ours reads it in one pass, and agrees with
    it on ordinary completions."""
    from reasoning_gym.utils import extract_answer as rg_extract

    from rllib_dph.envs.reasoning_gym import extract_answer

    for completion in ["<answer>12</answer>", "think <answer> 1+2 </answer> more <answer>3</answer>",
                       "<answer>1</answer><answer>cut", "no answer", "<answer>\n(3*4)\n</answer>\n"]:
        assert extract_answer(completion) == rg_extract(completion)
    start = time.monotonic()
    assert extract_answer("<answer>" * 200_000) is None
    assert extract_answer("<answer>" * 200_000 + "7</answer>") == "7"
    assert time.monotonic() - start < 2.0
