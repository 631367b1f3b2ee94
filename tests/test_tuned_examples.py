"""Every tuned example defines a valid config and stop criteria (loading only; no training)."""

import pathlib

import pytest
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.cli.experiments import load_tuned_example

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "tuned_examples").rglob("*.py"))


def test_the_required_examples_exist():
    names = {p.relative_to(p.parents[1]).as_posix() for p in EXAMPLES}
    assert {
        "grpo/sql_tiny_grpo.py", "grpo/sql_tiny_dapo.py", "grpo/sql_tiny_rkl.py",
        "dph/sql_tiny_dph_f.py", "dph/sql_tiny_dph_js.py", "dph/sql_tiny_dph_alpha.py",
        "dppo/sql_tiny_dppo_tv.py", "dppo/sql_tiny_dppo_kl.py", "dppo/math_tiny_dppo_tv.py",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_validates(path, tmp_path):
    config, stop = load_tuned_example(str(path))
    assert isinstance(config, AlgorithmConfig)
    assert stop and all(isinstance(v, (int, float)) for v in stop.values())
    text = path.read_text()
    assert '"""' in text and "How to run" in text and "Results to expect" in text
    if "grid_search" in text:
        return  # a Tune sweep: fields hold search spaces until Tune resolves them
    if isinstance(config, DPHConfig):
        config.dph(presample={"out_dir": str(tmp_path / "presample")})  # validated after pre-sampling
    config.validate()
