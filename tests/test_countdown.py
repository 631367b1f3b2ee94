"""The countdown solver and the countdown warm start's SFT rows (rllib_dph.envs.countdown): every
solution the solver writes gets full credit from reasoning-gym's own scorer, none is missing
against a brute force over reasoning-gym's generated puzzles, and the rows use the env's prompts."""

import itertools
from fractions import Fraction

import numpy as np
import pytest

from rllib_dph.envs.countdown import CountdownSFT, choose_solutions, sft_examples, solve


@pytest.mark.parametrize(
    "numbers,target,expected",
    [
        ((3, 4), 7, ["3+4", "4+3"]),
        ((3, 4), 12, ["3*4", "4*3"]),
        ((2, 8), 4, ["8/2"]),
        ((1, 2, 3), 0, ["1+2-3", "2-3+1", "1-(3-2)", "3-1-2", "3-(1+2)"]),
    ],
)
def test_solve_by_hand_additive(numbers, target, expected):
    solutions = solve(numbers, target)
    for text in expected:
        assert text in solutions
    for text in solutions:
        assert eval(text) == target  # noqa: S307 (our own arithmetic text)


def test_solve_writes_only_the_parentheses_the_reading_needs():
    solutions = solve((2, 3, 4), 20)  # (2+3)*4, 4*(2+3), ...
    assert "(2+3)*4" in solutions and "4*(2+3)" in solutions
    assert not any(s.startswith("(2*3)") or s.startswith("(3*2)") for s in solve((2, 3, 4), 10))  # 2*3+4
    assert "12/(2*3)" in solve((12, 2, 3), 2) and "12/2/3" in solve((12, 2, 3), 2)
    assert "4-(3-2)" in solve((2, 3, 4), 3) and "4-3+2" in solve((2, 3, 4), 3)


def test_solve_uses_exact_fractions():
    assert "7/2*4" in solve((7, 2, 4), 14)  # 3.5 on the way
    assert solve((1, 1, 1), 5) == []


def test_solve_refuses_too_many_numbers():
    with pytest.raises(ValueError, match="7 numbers"):
        solve((1,) * 7, 3)


def _brute_force(numbers, target):
    """Whether any expression tree over any order of ``numbers`` has the value ``target``."""
    def values(ns):
        if len(ns) == 1:
            yield Fraction(ns[0])
            return
        for cut in range(1, len(ns)):
            for a in values(ns[:cut]):
                for b in values(ns[cut:]):
                    yield from (a + b, a - b, a * b)
                    if b != 0:
                        yield a / b
    return any(v == target for order in itertools.permutations(numbers) for v in values(order))


def test_every_solution_gets_full_credit_from_reasoning_gyms_scorer():
    rg = pytest.importorskip("reasoning_gym", reason='needs reasoning-gym: pip install -e ".[reasoning-gym]"')
    data = rg.create_dataset("countdown", seed=3, size=12, min_numbers=3, max_numbers=4, min_value=1,
                             max_value=20, min_target=1, max_target=100)
    for entry in data:
        meta = entry["metadata"]
        solutions = solve(meta["numbers"], meta["target"])
        assert solutions, entry["question"]  # the generator's own expression is one
        assert _brute_force(meta["numbers"], meta["target"])
        for text in solutions[:40]:
            assert data.score_answer(text, entry) == 1.0, (text, meta)
        assert data.score_answer(f"{solutions[0]}+0", entry) == 0.05  # another number: not a solution


def test_choose_solutions_draws_distinct_shapes():
    from rllib_dph.envs.reasoning_gym import countdown_shape

    numbers = (2, 3, 4)
    solutions = solve(numbers, 10)  # 2*3+4, 4+2*3, 3*2+4, (4-2)*... : several shapes

    chosen = choose_solutions(solutions, numbers, 3, np.random.default_rng(0))
    shapes = [countdown_shape(s, numbers) for s in chosen]
    assert len(set(shapes)) == len(shapes) == min(3, len({countdown_shape(s, numbers) for s in solutions}))
    assert choose_solutions(solutions, numbers, 3, np.random.default_rng(0)) == chosen  # seeded


def test_sft_rows_use_the_envs_prompts_and_name_their_shape():
    pytest.importorskip("reasoning_gym", reason='needs reasoning-gym: pip install -e ".[reasoning-gym]"')
    from rllib_dph.envs.countdown import sft_examples
    from rllib_dph.envs.reasoning_gym import ReasoningGymEnv

    spec = CountdownSFT(config=(("min_numbers", 3), ("max_numbers", 3), ("max_value", 20), ("min_target", 1),
                                ("max_target", 100)), size=6, solutions_per_prompt=3)
    rows = sft_examples(spec)
    env = ReasoningGymEnv(**spec.env_config(split="train"))
    by_id = {task.id: task for task in env.tasks}
    assert {row["task_id"] for row in rows} == set(by_id)
    for row in rows:
        task = by_id[row["task_id"]]
        assert row["messages"] == [dict(m) for m in task.messages]
        assert row["completion"].startswith("<answer>") and row["completion"].endswith("</answer>")
        assert env.score(row["completion"], task.ground_truth).correct
        assert row["style"].count(",") == 2
    per_task = {tid: [r["style"] for r in rows if r["task_id"] == tid] for tid in by_id}
    assert all(1 <= len(s) <= 3 and len(set(s)) == len(s) for s in per_task.values())


def test_a_warm_start_with_countdown_draws_its_rows_from_the_puzzles():
    pytest.importorskip("reasoning_gym", reason='needs reasoning-gym: pip install -e ".[reasoning-gym]"')
    from rllib_dph.models.build.warm_start import WARM_STARTS, WarmStartSpec, training_examples

    puzzles = CountdownSFT(config=(("min_numbers", 3), ("max_numbers", 3)), size=5, solutions_per_prompt=2)
    spec = WarmStartSpec(base="tiny-sql-math", splits=(), countdown=puzzles, sft_steps=2, batch_size=4)
    rows = training_examples(spec)
    assert len(rows) == 8 and all(r["task_id"].startswith("countdown/train/s0/") for r in rows)
    assert WARM_STARTS["tiny-countdown"].countdown.held_out == (300, 2000)


def test_held_out_puzzles_stay_out_of_the_sft_rows():
    """A pool larger than the RL train split leaves out every question of the held-out split."""
    pytest.importorskip("reasoning_gym", reason='needs reasoning-gym: pip install -e ".[reasoning-gym]"')
    from rllib_dph.envs.reasoning_gym import ReasoningGymEnv

    config = (("min_numbers", 3), ("max_numbers", 3), ("min_value", 1), ("max_value", 2), ("min_target", 1),
              ("max_target", 6))
    test = ReasoningGymEnv("countdown", config=dict(config), size=8, seed=0, split="test", train_size=4)
    held_out = {t.ground_truth["question"] for t in test.tasks}
    question = lambda row: row["messages"][-1]["content"]  # noqa: E731
    everything = sft_examples(CountdownSFT(config=config, size=60, solutions_per_prompt=1))
    assert any(question(r) in held_out for r in everything)  # the small config repeats its questions
    kept = sft_examples(CountdownSFT(config=config, size=60, solutions_per_prompt=1, held_out=(8, 4)))
    assert kept and not any(question(r) in held_out for r in kept)
    assert {question(r) for r in kept} == {question(r) for r in everything} - held_out


def test_working_follows_the_text_as_it_reads():
    from rllib_dph.envs.countdown import working, worked_solutions

    assert [f"{a}{op}{b}={r}" for a, op, b, r in working("9+20-7")] == ["9+20=29", "29-7=22"]
    assert [f"{a}{op}{b}={r}" for a, op, b, r in working("9+(20-7)")] == ["20-7=13", "9+13=22"]
    assert [f"{a}{op}{b}={r}" for a, op, b, r in working("2*3+4*5")] == ["2*3=6", "4*5=20", "6+20=26"]
    with pytest.raises(ValueError, match="not integer arithmetic"):
        working("__import__('os')")
    with pytest.raises(ValueError, match="divides by zero"):
        working("3/(2-2)")
    worked = worked_solutions((7, 2, 4), 14)
    assert worked["4*7/2"] == "4*7=28 28/2=14" and "7/2*4" not in worked  # 3.5 on the way
    assert "3-(9-19)" not in worked_solutions((3, 9, 19), 13)  # -10 on the way
    assert set(worked) <= set(solve((7, 2, 4), 14))


def test_worked_rows_write_the_working_before_the_answer():
    pytest.importorskip("reasoning_gym", reason='needs reasoning-gym: pip install -e ".[reasoning-gym]"')
    from rllib_dph.envs.countdown import sft_examples
    from rllib_dph.envs.reasoning_gym import extract_answer

    rows = sft_examples(CountdownSFT(config=(("min_numbers", 3), ("max_numbers", 3), ("max_value", 20)), size=4,
                                     solutions_per_prompt=2, worked=True))
    for row in rows:
        steps, answer = row["completion"].split("\n")
        expression = extract_answer(row["completion"])
        assert answer == f"<answer>{expression}</answer>" and steps.count("=") == 2
        assert float(steps.split("=")[-1]) == eval(expression)  # noqa: S307 (our own arithmetic text)
