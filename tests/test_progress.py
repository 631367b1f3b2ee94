"""Pre-sampling and evaluation show a progress bar over prompts on stderr when it is a terminal,
and none when it is not (a log file) or when asked for none; pre-sampling first says what it
samples, where, in one line."""

import io
import json
import sys

import pytest

from rllib_dph.engines.base import SamplingParams
from rllib_dph.evaluation import EvalSettings, evaluate_policy
from rllib_dph.algorithms.dph.presample import PresampleConfig, presample


class _Stderr(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def math_data(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text("\n".join(
        json.dumps({"data_source": "math", "prompt": [{"role": "user", "content": f"What is 2+{i}?"}],
                    "reward_model": {"ground_truth": str(2 + i)}, "id": i})
        for i in range(3)
    ))
    return str(path)


def _presample(tmp_path, math_data, monkeypatch, *, tty: bool, progress: bool = True) -> str:
    stderr = _Stderr(tty)
    monkeypatch.setattr(sys, "stderr", stderr)
    out = tmp_path / f"pre_{tty}_{progress}"
    presample(PresampleConfig(model_name="tiny-random", env="rllib_dph/Math-v0", env_config={"data": math_data},
                              out_dir=str(out), k=2, min_correct=1, prompts_per_chunk=2,
                              sampling=SamplingParams(max_new_tokens=4, seed=0)), progress=progress)
    return stderr.getvalue()


def test_presampling_shows_a_bar_over_prompts_on_a_terminal(tmp_path, math_data, monkeypatch):
    err = _presample(tmp_path, math_data, monkeypatch, tty=True)
    assert f"rllib: pre-sampling 3 prompts, k=2 samples each, into {tmp_path / 'pre_True_True'}" in err
    last = err.split("\r")[-1]
    assert last.startswith("pre-sampling k=2: 100%|") and "| 3/3 [" in last and "prompt/s]" in last


def test_presampling_is_quiet_in_a_log_file_or_when_asked(tmp_path, math_data, monkeypatch):
    err = _presample(tmp_path, math_data, monkeypatch, tty=False)
    assert "rllib: pre-sampling 3 prompts" in err and "pre-sampling k=2" not in err
    assert "pre-sampling" not in _presample(tmp_path, math_data, monkeypatch, tty=True, progress=False)


@pytest.mark.parametrize("tty", [True, False])
def test_evaluation_shows_its_bar_only_on_a_terminal(math_data, monkeypatch, tty):
    stderr = _Stderr(tty)
    monkeypatch.setattr(sys, "stderr", stderr)
    settings = EvalSettings(sampling=SamplingParams(n=2, max_new_tokens=4, seed=0), greedy=False, progress=True)
    evaluate_policy("tiny-random", "rllib_dph/Math-v0", {"data": math_data}, settings)
    assert ("evaluating n=2: 100%|" in stderr.getvalue()) == tty
