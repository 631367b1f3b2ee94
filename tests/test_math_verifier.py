"""Math answer extraction and checking (rllib_dph.envs.math): equivalences, hostile inputs, the env."""

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rllib_dph.envs.base import Task
from rllib_dph.envs.math import (
    CHECKER_KILL_GRACE_S,
    CHECKER_WALL_FACTOR,
    MathEnv,
    extract_answer,
    math_reward,
    set_checker_pool,
    start_checker,
    verify_math,
)
from rllib_dph.envs.isolation import _POOL


@pytest.mark.parametrize(
    "gold,pred,expected",
    [
        # integers, decimals, fractions
        ("42", "42", True),
        ("42", "43", False),
        ("-3", "- 3", True),
        ("10", "10.0", True),
        ("3/4", "0.75", True),
        ("\\frac{3}{4}", "\\dfrac{3}{4}", True),
        ("\\frac{1}{2}", "\\frac12", True),
        ("1/3", "0.333333", True),
        ("1/3", "0.3", False),
        ("2/3", "3/2", False),
        ("1000", "1,000", True),
        # percentages
        ("50\\%", "0.5", True),
        ("50\\%", "50", True),
        ("25\\%", "0.75", False),
        # radicals and symbolic forms
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
        ("2\\sqrt{3}", "\\sqrt{12}", True),
        ("\\sqrt{2}", "\\sqrt{3}", False),
        ("x+1", "1+x", True),
        ("\\pi", "3.14159265", True),
        # tuples, intervals and sets
        ("(1,2)", "(1, 2)", True),
        ("(1,2)", "(2,1)", False),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        # LaTeX variants
        ("\\left(1,2\\right)", "(1,2)", True),
        ("\\text{(A)}", "A", True),
        ("5", "\\text{5 apples}", False),
    ],
)
def test_answer_pairs(gold, pred, expected):
    verdict = verify_math(f"Some work first. So the result is \\boxed{{{pred}}}.", gold)
    assert verdict.correct is expected
    assert verdict.reward == (1.0 if expected else 0.0)


@pytest.mark.parametrize(
    "completion,answer",
    [
        ("\\boxed{1} then \\boxed{2}", "2"),  # the last box counts
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not braces
        ("\\fbox{7}", "7"),
        ("\\boxed {8}", "8"),
        ("\\boxed{3} and a cut-off \\boxed{4", "3"),  # last *complete* box
        ("So the answer is 12.", "12"),
        ("The answer is: $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("the answer is 3\nno wait, The final answer is **5**", "5"),
        ("I do not know.", None),
        ("\\boxed{", None),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


@pytest.mark.parametrize(
    "completion,gold,reason",
    [
        ("no boxed answer here", "1", "no answer found"),
        ("\\boxed{1}", "", "gold answer is empty"),
        (None, "1", "not a str"),
    ],
)
def test_unusable_inputs_give_zero_and_a_reason(completion, gold, reason):
    verdict = verify_math(completion, gold)
    assert verdict.reward == 0.0 and not verdict.correct
    assert reason in verdict.error


def test_numeric_gold_and_boxed_gold():
    assert math_reward("\\boxed{0.5}", 0.5) == 1.0
    assert math_reward("\\boxed{12}", 12) == 1.0
    assert math_reward("\\boxed{12}", "$\\boxed{12}$") == 1.0


HOSTILE = {
    "tower of powers": "9^{9^{9^9}}",
    "huge power": "2^{10^{10}}",
    "deep fractions": "\\frac{" * 300 + "1" + "}{2}" * 300,
    "deep parentheses": "(" * 2000 + "1" + ")" * 2000,
    "deep radicals": "\\sqrt{" * 500 + "2" + "}" * 500,
    "long sum": "+".join(["x"] * 5000),
    "malformed": "\\frac{\\sqrt{}{}}^{^{_}}\\left(\\right]",
}
TIMEOUT_S = 0.5
#: Worst wall time of a check: the limit counts CPU time, so a loaded machine stretches it up to
#: the wall-clock cap, after which the pair is checked once more (about 0.7 s on an idle machine).
MAX_WALL_S = 2 * (CHECKER_WALL_FACTOR * TIMEOUT_S + CHECKER_KILL_GRACE_S) + 1.0


def _timed_check(pred: str) -> tuple[float, object]:
    start = time.monotonic()
    verdict = verify_math(f"\\boxed{{{pred}}}", "3", timeout_s=TIMEOUT_S)
    return time.monotonic() - start, verdict


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "worker thread"])
def test_hostile_answers_return_within_the_timeout(in_thread):
    with ThreadPoolExecutor(max_workers=1) as pool:
        for name, pred in HOSTILE.items():
            start_checker()  # start-up (after a kill) is not part of timeout_s
            if in_thread:
                elapsed, verdict = pool.submit(_timed_check, pred).result()
            else:
                elapsed, verdict = _timed_check(pred)
            assert verdict.reward == 0.0, name
            assert elapsed < MAX_WALL_S, f"{name} took {elapsed:.2f} s"
    assert verify_math("\\boxed{1+x}", "x+1").correct  # the checker still works afterwards


def _next_checker():
    """The process of the checker the next call will use (started and idle)."""
    start_checker()
    return _POOL._idle[-1][1].proc


def test_stopped_checker_is_replaced_and_the_pair_checked_again():
    stopped = _next_checker()
    os.kill(stopped.pid, signal.SIGSTOP)  # silent without using CPU: only a kill ends it
    start = time.monotonic()
    verdict = verify_math("\\boxed{x^{2}}", "x^2", timeout_s=0.2)
    elapsed = time.monotonic() - start
    assert verdict.correct, verdict.error  # checked again on a fresh checker
    assert elapsed < CHECKER_WALL_FACTOR * 0.2 + CHECKER_KILL_GRACE_S + 5.0
    assert stopped.poll() is not None  # killed


def test_a_starved_checker_is_not_charged_for_waiting():
    """The limit counts the checker's CPU time: 1 s without CPU is no timeout at 0.3 s."""
    starved = _next_checker()
    os.kill(starved.pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (starved.pid, signal.SIGCONT)).start()
    start = time.monotonic()
    verdict = verify_math("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", timeout_s=0.3)
    assert verdict.correct, verdict.error
    assert time.monotonic() - start >= 1.0
    assert starved.poll() is None  # the same checker answered


def test_checker_start_up_is_not_charged():
    _POOL.close()  # the next check starts a checker (~0.7 s of CPU to import Math-Verify)
    verdict = verify_math("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", timeout_s=0.2)
    assert verdict.correct, verdict.error


@pytest.fixture
def small_pool():
    size, idle_s = _POOL.size, _POOL.idle_s
    set_checker_pool(size=2, idle_s=0.2)
    yield
    set_checker_pool(size=size, idle_s=idle_s)


def test_pool_is_bounded_and_shrinks_when_idle(small_pool):
    _POOL.close()
    pairs = [("\\boxed{x+1}", "1+x", True), ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
             ("\\boxed{x-1}", "1+x", False)] * 4
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda p: verify_math(p[0], p[1]).correct, pairs))
        assert len(_POOL._live) <= 2
    assert results == [p[2] for p in pairs]
    processes = [checker.proc for _, checker in _POOL._idle]
    assert processes
    deadline = time.monotonic() + 3.0  # the pool's service thread stops idle checkers itself
    while (_POOL._live or any(p.poll() is None for p in processes)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not _POOL._live and all(p.poll() is not None for p in processes)


def test_waiting_threads_are_served_in_turn(small_pool):
    """With one checker and four threads checking in a loop, every thread gets its first answer
    before any gets its fourth: a thread that releases the checker cannot take it straight back."""
    set_checker_pool(size=1)
    start_checker()
    done: dict[int, list[float]] = {}

    def loop(thread):
        for _ in range(6):
            assert verify_math("\\boxed{x+1}", "1+x").correct
            done.setdefault(thread, []).append(time.monotonic())

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(loop, range(4)))
    assert max(times[0] for times in done.values()) < min(times[3] for times in done.values())


@pytest.mark.parametrize("kwargs", [{"size": 0}, {"size": 1.5}, {"idle_s": 0}])
def test_bad_pool_bounds(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        set_checker_pool(**kwargs)


_PARENT = """
import os, sys, time
from rllib_dph.envs.isolation import _POOL
from rllib_dph.envs.math import start_checker
start_checker()
print(_POOL._idle[-1][1].proc.pid, flush=True)
time.sleep(60)
"""


def test_checker_dies_with_its_parent():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    checker_pid = int(parent.stdout.readline())
    parent.kill()  # no atexit, no clean-up: only the kernel can tell the checker
    parent.wait()
    deadline = time.monotonic() + 5.0
    while _alive(checker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(checker_pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_concurrent_threads_share_the_checkers():
    pairs = [("\\boxed{x+1}", "1+x", True), ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
             ("\\boxed{x-1}", "1+x", False)] * 4
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda p: verify_math(p[0], p[1]).correct, pairs))
    assert results == [p[2] for p in pairs]


def _math_task(i: int, question: str, answer: str) -> Task:
    return Task(
        id=f"q{i}",
        data_source="unit",
        messages=({"role": "user", "content": question},),
        ground_truth=answer,
    )


def test_math_env_scores_completions():
    env = MathEnv.from_tasks([_math_task(0, "What is 1/2 + 1/4?", "\\frac{3}{4}"),
                              _math_task(1, "What is 2 + 2?", "4")])
    obs, info = env.reset(options={"index": 0})
    assert obs == "What is 1/2 + 1/4?" and info["task_id"] == "q0"
    _, reward, terminated, truncated, info = env.step("1/2 + 1/4 = \\boxed{0.75}")
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)
    env.reset(options={"index": 1})
    _, reward, _, _, info = env.step("I think it is 5")
    assert reward == 0.0 and not info["correct"] and "no answer found" in info["error"]


def test_math_env_rejects_a_bad_timeout():
    with pytest.raises(ValueError, match="timeout_s=0"):
        MathEnv.from_tasks([_math_task(0, "q", "1")], timeout_s=0)


def test_reference_solutions_of_the_bundled_suite_are_correct():
    env = MathEnv("math_synth/test")
    for index, task in enumerate(env.tasks[:100]):
        for style, solution in task.meta["styles"].items():
            env.reset(options={"index": index})
            _, reward, _, _, info = env.step(solution)
            assert reward == 1.0, (task.id, style, info.get("error"))
        env.reset(options={"index": index})
        assert env.step("\\boxed{" + task.ground_truth + " + 1}")[1] == 0.0  # a wrong answer
