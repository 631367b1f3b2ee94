"""Every engine of ``rllib_dph.engines.ENGINES`` against the ``RolloutEngine`` contract
(``rllib_dph.engines.check``), one test per engine and check, on the bundled tiny-random model.

An engine with an optional dependency runs under the pytest marker of its name when pytest.ini
registers one (deselected by default; ``-m vllm`` in the CI step ``.ci/vllm``), and is skipped
where its dependency is not installed.
"""

import gc

import pytest
import torch

from rllib_dph.engines import ENGINES
from rllib_dph.engines.check import CHECKS, EngineCheckError, Subject, check_engine, run_check


def _registered_markers(config) -> set[str]:
    return {line.split(":")[0].strip() for line in config.getini("markers")}


def pytest_generate_tests(metafunc):
    if "subject" in metafunc.fixturenames:
        markers = _registered_markers(metafunc.config)
        params = [
            pytest.param(name, marks=[getattr(pytest.mark, name)] if name in markers else [], id=name)
            for name in ENGINES
        ]
        metafunc.parametrize("subject", params, indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model's matrices are too small to split: on shared cores two threads made each
    check 10-30 times slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def subject(request):
    name = request.param
    optional = name in _registered_markers(request.config)
    try:
        built = Subject.build(name)
    except ModuleNotFoundError as error:
        if not optional:
            raise
        pytest.skip(f"engine {name!r} needs {error.name}, which is not installed")
    yield built
    del built
    gc.collect()


@pytest.mark.parametrize("check", list(CHECKS))
def test_engine_conforms(subject, check):
    run_check(subject, check)


class NoTopK:
    """A broken engine: an HF engine that drops the top-K log-probs it was asked for."""

    def __init__(self, engine):
        self.engine, self.tokenizer = engine, engine.tokenizer

    @classmethod
    def from_pretrained(cls, model, **kwargs):
        from rllib_dph.engines.hf import HFEngine

        return cls(HFEngine.from_pretrained(model, **kwargs))

    def generate(self, prompts, params):
        groups = self.engine.generate(prompts, params)
        for group in groups:
            for c in group:
                c.topk_ids = c.topk_logprobs = None
        return groups

    def update_weights(self, state_dict):
        self.engine.update_weights(state_dict)


def test_check_engine_names_the_engine_and_the_broken_check():
    from rllib_dph.models.hub import resolve_model

    engine = NoTopK.from_pretrained(resolve_model("tiny-random"), dtype="float32")
    check_engine(engine, checks=["interface", "mu_equals_recompute"])  # what it keeps of the contract
    with pytest.raises(EngineCheckError, match="engine 'NoTopK' fails the 'top_k_logprobs' check: .*topk_ids"):
        check_engine(engine, checks=["top_k_logprobs"])
    with pytest.raises(ValueError, match=r"checks=\['nope'\] are not engine checks"):
        check_engine(engine, checks=["nope"])
    with pytest.raises(EngineCheckError, match="is not a RolloutEngine: it has no \\['tokenizer', 'update_weights'\\]"):
        check_engine(engine.engine.model)
