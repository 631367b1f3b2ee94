"""Shared fixtures: a Ray session and a small GRPO config on the untrained tiny model."""

import importlib.util
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# Never reach a model hub from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def tiny_random_built():
    """``tiny-random``, which many tests load by name, built once (seconds) when it is not: resolving
    a name never builds (``rllib_dph.models.hub``), a run's preparation step does."""
    from rllib_dph.models.build.prepare import prepare_model

    prepare_model("tiny-random", progress=False)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def without_ray():
    """No Ray in this process during the test (for tests that check a step starts none); a
    session-wide Ray that was running is started again afterwards."""
    import ray

    was_running = ray.is_initialized()
    if was_running:
        ray.shutdown()
    yield
    if was_running and not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


@pytest.fixture
def tiny_grpo_config():
    """GRPO on the SQL suite with the untrained ``tiny-random`` model: seconds per iteration."""
    from rllib_dph.algorithms.grpo import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=16)
        .training(group_size=4, prompts_per_step=4, lr=1e-3, minibatch_size=8)
        .debugging(seed=0)
    )


@pytest.fixture(scope="session")
def load_script():
    """``load_script("research/reproduce_dph")``: the script ``research/reproduce_dph.py`` (a path
    from the repository root, without ``.py``: ``bench/``, ``research/``, ``tools/offline_kit/``)
    as a module, loaded once per session and registered under its file name, with its own folder on
    ``sys.path`` while it loads (the scripts import their neighbours: ``reproduce_dph`` imports
    ``workers``, ``vllm_kit`` ``gpu_suite``)."""

    def load(script: str):
        path = REPO / f"{script}.py"
        name = path.stem
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(path.parent))
        return module

    return load
