"""Your own style function in evaluation: per-style pass@k and distinct correct answers for any
env, through ``EvalSettings(style_fn=...)`` and ``rllib evaluate --style-fn module:function``."""

import json

import numpy as np
import pytest

import rllib_dph.envs
from rllib_dph.chat import encode_prompt
from rllib_dph.cli.main import main
from rllib_dph.engines.base import Completion, SamplingParams
from rllib_dph.envs import make_env
from rllib_dph.evaluation import EvalSettings, evaluate_engine, pass_at_k
from rllib_dph.evaluation.runner import load_style_fn
from rllib_dph.models.hub import load_tokenizer


class Scripted:
    """An engine answering each prompt with fixed sample texts (greedy: the first one)."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            texts = self.script[tuple(prompt)]
            texts = texts[:1] if params.temperature == 0 else texts[: params.n]
            ids = [np.array(self.tokenizer(t, add_special_tokens=False)["input_ids"], dtype=np.int64) for t in texts]
            out.append([Completion(token_ids=i, logprobs=np.zeros(len(i), dtype=np.float32)) for i in ids])
        return out


def sum_verifier(completion, answer):
    """Correct when the completion evaluates to the answer (digits and + only)."""
    text = completion.strip()
    if not text or not set(text) <= set("0123456789+"):
        return False
    return sum(int(p) for p in text.split("+") if p) == int(answer)


def shape(completion, task):
    """'sum' for an expression, 'number' for a plain number, None otherwise."""
    text = completion.strip()
    if text.isdigit():
        return "number"
    return "sum" if "+" in text else None


@pytest.fixture(scope="module")
def sum_env():
    rllib_dph.envs.register_verifier_env(
        "test/StyleSum-v0", verifier=sum_verifier,
        data=[{"question": "3 and 4", "answer": "7"}, {"question": "5 and 5", "answer": "10"}],
        prompt_format="Add {question}.",
    )
    return make_env("test/StyleSum-v0", {})


def scripted(env, samples):
    tokenizer = load_tokenizer("tiny-random")
    script = {tuple(encode_prompt(tokenizer, [dict(m) for m in t.messages])): s for t, s in zip(env.tasks, samples)}
    return Scripted(tokenizer, script)


def test_style_fn_gives_per_style_pass_and_distinct_correct_answers(sum_env):
    samples = [["3+4", "7", "4+3", "8"], ["5+5", "11", "x", "10"]]
    settings = EvalSettings(sampling=SamplingParams(n=4), style_fn=shape, greedy=False)
    result = evaluate_engine(scripted(sum_env, samples), sum_env, settings)

    assert [r.correct for r in result.records] == [[True, True, True, False], [True, False, False, True]]
    assert [r.styles for r in result.records] == [["sum", "number", "sum", "number"], ["sum", "number", "none", "number"]]
    summary = result.summary()
    # prompt 0: 2 correct sums, 1 correct number; prompt 1: 1 correct sum, 1 correct number
    assert summary["pass@1/sum"] == pytest.approx((pass_at_k(4, 2, 1) + pass_at_k(4, 1, 1)) / 2)
    assert summary["pass@2/number"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 1, 2)) / 2)
    assert summary["style_counts"] == {"sum": 3, "number": 4, "none": 1}
    # the default solution key is the whitespace-folded text: 3+4, 7, 4+3 are three correct answers
    assert summary["distinct_correct@4"] == pytest.approx((3 + 2) / 2)


def test_style_fn_errors_name_the_function_and_the_task(sum_env):
    engine = scripted(sum_env, [["7"] * 2, ["10"] * 2])

    def broken(completion, task):
        raise KeyError("numbers")

    with pytest.raises(ValueError, match=r"style_fn .*broken raised KeyError.* on task .*completion '7'"):
        evaluate_engine(engine, sum_env, EvalSettings(sampling=SamplingParams(n=2), style_fn=broken))
    with pytest.raises(ValueError, match=r"returned 3 on task"):
        evaluate_engine(engine, sum_env, EvalSettings(sampling=SamplingParams(n=2), style_fn=lambda c, t: 3))
    with pytest.raises(ValueError, match="give one of them"):
        EvalSettings(style_fn=shape, style_suite="sql_synth")
    with pytest.raises(ValueError, match="not a function"):
        EvalSettings(style_fn="tests.test_style_fn:shape")


def test_load_style_fn_resolves_module_function_and_refuses_other_specs():
    assert load_style_fn("test_style_fn:shape") is shape
    for spec, message in [("shape", "not 'module:function'"), ("no_such_module_xyz:f", "ModuleNotFoundError"),
                          ("test_style_fn:nope", "AttributeError"), ("test_style_fn:SamplingParams", None)]:
        if message is None:
            load_style_fn(spec)  # a class is callable: accepted
            continue
        with pytest.raises(ValueError, match=message):
            load_style_fn(spec)


def test_rllib_evaluate_style_fn_flag(tmp_path, monkeypatch):
    (tmp_path / "my_styles.py").write_text(
        "def by_length(completion, task):\n"
        "    return 'short' if len(completion) < 10 else 'long'\n"
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    main(["evaluate", "tiny-random", "--env", "rllib_dph/SQL-v0", "--env-config", '{"data": "sql_synth/test"}',
          "--n", "2", "--limit", "2", "--max-new-tokens", "12", "--no-greedy", "--style-fn", "my_styles:by_length",
          "--out", str(out)])
    data = json.loads((out / "results.json").read_text())
    styles = {s for r in data["records"] for s in r["styles"]}
    assert styles and styles <= {"short", "long"}
    with pytest.raises(SystemExit, match="--style-fn: style function 'my_styles' is not 'module:function'"):
        main(["evaluate", "tiny-random", "--style-fn", "my_styles", "--out", str(out)])
