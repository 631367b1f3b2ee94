"""The env registry: a new task in a few lines, gymnasium.make, Ray Tune names, check_env."""

import math
import os
import runpy
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rllib_dph.envs
from rllib_dph.envs.base import Verdict, VerifierEnv
from rllib_dph.envs.data import load_tasks
from rllib_dph.envs.registry import DEFAULT_VERIFIER_TIMEOUT_S, FunctionVerifierEnv, register_verifier_env

REPO = Path(__file__).resolve().parents[1]
WORDS = ["ray", "rllib", "policy", "gradient", "reward"]


def _register_reverse(env_id="test/Reverse-v0", **kwargs):
    # The example of docs/environments.md: an exact-match string task registered in one call.
    rllib_dph.envs.register_verifier_env(
        env_id,
        verifier=lambda completion, answer: completion.strip() == answer,
        data=[{"question": w, "answer": w[::-1]} for w in WORDS],
        prompt_format="Reverse the word: {question}",
        **kwargs,
    )


def test_the_example_in_the_envs_folder_registers_a_working_env():
    """envs/example_verifier.py (the users' starting point): importing it registers its env,
    which rewards a CTE that returns the gold rows, and nothing else."""
    runpy.run_path(str(REPO / "envs" / "example_verifier.py"))
    env = gym.make("example/SQLWithCTE-v0")
    prompt, _ = env.reset(options={"index": 1})
    task = env.unwrapped.tasks[1]
    assert prompt == task.prompt_text and "Question:" in prompt
    styles = task.meta["styles"]
    answers = {
        "a CTE with the gold rows": (f"```sql\n{styles['cte']}\n```", 1.0),
        "the gold rows, not as a CTE": (f"```sql\n{styles['plain']}\n```", 0.0),
        "a CTE with other rows": ("```sql\nWITH t AS (SELECT 1 AS x) SELECT x FROM t WHERE x = 2\n```", 0.0),
        "a CTE that fails": ("```sql\nWITH t AS (SELECT nope FROM nowhere) SELECT * FROM t\n```", 0.0),
        "no sql block": (styles["cte"], 0.0),
    }
    for what, (completion, reward) in answers.items():
        env.reset(options={"index": 1})
        assert env.step(completion)[1] == reward, what


def test_the_example_runs_as_a_script():
    out = subprocess.run([sys.executable, "envs/example_verifier.py"], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=True)
    assert out.stdout.splitlines() == [
        "Question: Which departments have building Central and budget more than 64000? Give their names.",
        "plain query: reward 0.0, correct False",
        "cte query: reward 1.0, correct True",
    ]


def test_the_bundled_envs_base_takes_the_same_verifier_as_register_verifier_env():
    """One verifier signature: ``verifier(completion, ground_truth) -> bool | float | Verdict``."""
    tasks = load_tasks([{"q": "x", "answer": "y"}], task="generic", prompt_format="{q}")
    env = VerifierEnv(tasks, lambda completion, ground_truth: completion == ground_truth)
    env.reset(options={"index": 0})
    assert env.step("y")[1:3] == (1.0, True)
    env.reset(options={"index": 0})
    assert env.step("n")[1] == 0.0


def test_register_make_and_step_a_new_task():
    _register_reverse()
    env = gym.make("test/Reverse-v0")
    obs, info = env.reset(seed=0, options={"index": 1})
    assert obs == "Reverse the word: rllib" and info["task_id"] == "1"
    _, reward, terminated, truncated, info = env.step(" billr\n")
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)
    env.reset(options={"index": 1})
    _, reward, _, _, info = env.step("rllib")
    assert reward == 0.0 and not info["correct"] and "error" not in info


@pytest.mark.parametrize(
    "result,reward,correct,error",
    [
        (True, 1.0, True, None),
        (False, 0.0, False, None),
        (0.5, 0.5, False, None),
        (1, 1.0, True, None),
        (Verdict(0.25, True, "partial"), 0.25, True, "partial"),
    ],
)
def test_verifier_results_become_verdicts(result, reward, correct, error):
    rows = [{"q": "x", "answer": "y"}]
    env = FunctionVerifierEnv(rows, verifier=lambda c, gt: result, prompt_format="{q}")
    env.reset()
    _, got_reward, _, _, info = env.step("anything")
    assert (got_reward, info["correct"], info.get("error")) == (reward, correct, error)


def test_a_raising_verifier_gives_zero_and_the_reason():
    def verifier(completion, ground_truth):
        raise KeyError("boom")

    env = FunctionVerifierEnv([{"q": "x", "answer": "y"}], verifier=verifier, prompt_format="{q}")
    env.reset()
    _, reward, _, _, info = env.step("z")
    assert reward == 0.0 and info["error"] == "verifier raised KeyError: 'boom'"


_RELEASE = threading.Event()


def _hangs_on_hang(completion, answer):
    """A verifier stuck on one input (until the test releases it); module-level: Tune pickles it."""
    if completion == "hang":
        _RELEASE.wait(60)
    return completion == answer


def test_a_hanging_verifier_is_cut_off_scored_0_and_the_env_goes_on(caplog):
    """The bundled verifiers' protection for a user's verifier: a call past verifier_timeout_s
    scores 0 with the reason, the step returns, and the next step scores normally."""
    register_verifier_env("test/Hang-v0", verifier=_hangs_on_hang, data=[{"q": "x", "answer": "y"}],
                          prompt_format="{q}", verifier_timeout_s=0.2)
    env = gym.make("test/Hang-v0")
    try:
        env.reset(options={"index": 0})
        start = time.monotonic()
        _, reward, terminated, _, info = env.step("hang")
        assert time.monotonic() - start < 5.0
        assert (reward, terminated, info["correct"]) == (0.0, True, False)
        assert info["error"] == "verifier timed out after 0.2 s (verifier_timeout_s)"
        assert "verifier timed out" in caplog.text
        env.reset(options={"index": 0})
        assert env.step("y")[1] == 1.0
    finally:
        _RELEASE.set()


def _where(completion, answer):
    """A verifier that says where it ran: its process and thread, in ``error``."""
    return Verdict(1.0, True, f"{os.getpid()} {threading.get_ident()}")


def test_verifier_timeout_default_override_and_off():
    """With a timeout the verifier runs in a checker subprocess of the isolation; with None, in
    the step's own thread."""
    _register_reverse("test/ReverseTimeout-v0")
    assert gym.make("test/ReverseTimeout-v0").unwrapped.verifier_timeout_s == DEFAULT_VERIFIER_TIMEOUT_S
    assert gym.make("test/ReverseTimeout-v0", verifier_timeout_s=2).unwrapped.verifier_timeout_s == 2.0
    here = f"{os.getpid()} {threading.get_ident()}"
    for timeout_s, in_this_thread in [(None, True), (5.0, False)]:
        env = FunctionVerifierEnv([{"q": "x", "answer": "y"}], verifier=_where, prompt_format="{q}",
                                  verifier_timeout_s=timeout_s)
        env.reset()
        _, reward, _, _, info = env.step("y")
        assert reward == 1.0
        assert (info["error"] == here) is in_this_thread
        assert (info["error"].split()[0] == str(os.getpid())) is in_this_thread


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, 7200, "5", True])
def test_a_bad_verifier_timeout_is_refused_at_registration(bad):
    with pytest.raises(ValueError, match=r"test/BadTimeout-v0: verifier_timeout_s=.* pass .*verifier_timeout_s=30"):
        _register_reverse("test/BadTimeout-v0", verifier_timeout_s=bad)
    with pytest.raises(ValueError, match="verifier_timeout_s="):
        rllib_dph.envs.register_multiturn_env(
            "test/BadTimeoutTurns-v0", tool=lambda call, gt: "", verifier=lambda c, gt: True,
            data=[{"q": "x", "answer": "y"}], prompt_format="{q}", verifier_timeout_s=bad,
        )


def test_a_verifier_returning_the_wrong_type_is_a_clear_error():
    rows = [{"q": "x", "answer": "y"}]
    env = FunctionVerifierEnv(
        rows, verifier=lambda c, gt: "yes", prompt_format="{q}", name="test/Bad-v0"
    )
    env.reset()
    with pytest.raises(TypeError, match="test/Bad-v0: the verifier returned a str"):
        env.step("z")


def test_extra_registration_kwargs_go_to_the_verifier_and_can_be_overridden():
    register_verifier_env(
        "test/Echo-v0",
        verifier=lambda completion, answer, case_sensitive: (
            completion == answer if case_sensitive else completion.lower() == answer.lower()
        ),
        data=[{"question": "Ray", "answer": "Ray"}],
        prompt_format="Echo: {question}",
        case_sensitive=False,
    )
    for overrides, reward in [({}, 1.0), ({"case_sensitive": True}, 0.0)]:
        env = gym.make("test/Echo-v0", **overrides)
        env.reset()
        assert env.step("RAY")[1] == reward


@pytest.mark.parametrize(
    "env_id", ["Reverse-v0", "test/Reverse", "test/Reverse-vX", "a/b/c-v0", ""]
)
def test_unversioned_ids_are_rejected(env_id):
    with pytest.raises(ValueError, match="namespace/Name-vN"):
        _register_reverse(env_id)


def test_bad_registrations_fail_early():
    with pytest.raises(TypeError, match="verifier must be a function"):
        register_verifier_env("test/X-v0", verifier="exact", data=[{"a": 1}], prompt_format="{a}")
    with pytest.raises(ValueError, match="positional field"):
        register_verifier_env("test/X-v0", verifier=len, data=[{"a": 1}], prompt_format="{0}")


def test_registering_again_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _register_reverse()
        _register_reverse()
    assert rllib_dph.envs.registered_env_ids().count("test/Reverse-v0") == 1


def test_import_registers_the_bundled_envs_without_importing_ray():
    code = (
        "import sys, rllib_dph.envs, gymnasium as g; "
        "print('ray' in sys.modules, 'rllib_dph/Math-v0' in g.registry)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_tune_env_names_resolve_through_rllib():
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.env.env_context import EnvContext

    _register_reverse("test/TuneReverse-v0")
    assert "test/TuneReverse-v0" in rllib_dph.envs.register_tune_envs()
    assert "rllib_dph/Math-v0" in rllib_dph.envs.register_tune_envs()
    rows = [{"question": "abc", "answer": "cba"}]
    config = AlgorithmConfig().environment("test/TuneReverse-v0", env_config={"data": rows})
    env_id, creator = Algorithm._get_env_id_and_creator(config.env, config)
    # The creator was pickled into Tune's registry and loaded back, as in a remote worker.
    env = creator(EnvContext(config.env_config, worker_index=1))
    assert isinstance(env, FunctionVerifierEnv) and env_id == "test/TuneReverse-v0"
    assert env.reset()[0] == "Reverse the word: abc"
    assert env.step("cba")[1] == 1.0


def test_registration_after_ray_tune_is_imported_reaches_tune_at_once():
    from ray.tune.registry import ENV_CREATOR, _global_registry

    _register_reverse("test/LateReverse-v0")
    assert _global_registry.contains(ENV_CREATOR, "test/LateReverse-v0")


#: Bundled envs and a small split for each (their default, the train split, is larger).
BUNDLED = {"rllib_dph/SQL-v0": "sql_synth/test", "rllib_dph/Math-v0": "math_synth/test"}


def test_bundled_envs_are_registered_first():
    assert rllib_dph.envs.registered_env_ids()[:2] == list(BUNDLED)


@pytest.mark.parametrize("env_id", list(BUNDLED))
def test_check_env_on_bundled_envs(env_id):
    env = gym.make(env_id, data=BUNDLED[env_id])
    check_env(env.unwrapped, skip_render_check=True)


def test_check_env_on_a_registered_task():
    _register_reverse()
    check_env(gym.make("test/Reverse-v0").unwrapped, skip_render_check=True)
