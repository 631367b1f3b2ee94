"""A countdown solver and the supervised examples of a countdown warm start.

reasoning-gym's countdown data set gives one solution per puzzle (the expression it generated the
target from). A base policy that solves a puzzle in several ways needs several: :func:`solve`
enumerates every expression over the puzzle's numbers (each used once, ``+ - * /``, any order and
any bracketing) whose exact value is the target, and :func:`sft_examples` writes a sample of them,
of different shapes (:func:`rllib_dph.envs.reasoning_gym.countdown_style`: operator pattern,
parentheses, number order), as the answers of the train split's prompts, so that the SFT of a
warm start (``rllib_dph.models.warm_start``, ``WarmStartSpec.countdown``) teaches every shape a
puzzle allows. Puzzles, prompts and the scorer stay reasoning-gym's: the examples' prompts are
the env's own (``rllib_dph/ReasoningGym-v0``, split ``"train"``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator, Sequence

import numpy as np

#: Binding strength of each operator (a higher one binds tighter).
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
#: The precedence of a bare number.
_ATOM = 3


def _combine(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    """``a op b`` exactly; None for a division by zero."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def _render(op: str, left: tuple[str, int], right: tuple[str, int]) -> tuple[str, int]:
    """The text of ``left op right`` with the parentheses its reading needs and no others:
    the left side is bracketed when it binds looser than ``op``, the right side also when it
    binds as tightly and ``op`` is ``-`` or ``/`` (``a-(b-c)``, ``a/(b*c)``)."""
    (lt, lp), (rt, rp), p = left, right, _PRECEDENCE[op]
    if lp < p:
        lt = f"({lt})"
    if rp < p or (rp == p and op in "-/"):
        rt = f"({rt})"
    return f"{lt}{op}{rt}", p


def _expressions(numbers: tuple[int, ...]) -> Iterator[tuple[Fraction, tuple[str, int]]]:
    """Every (value, (text, precedence)) over ``numbers`` in this order, each number once, every
    binary bracketing and operator choice; sub-expressions that divide by zero are left out."""
    if len(numbers) == 1:
        yield Fraction(numbers[0]), (str(numbers[0]), _ATOM)
        return
    for cut in range(1, len(numbers)):
        lefts = list(_expressions(numbers[:cut]))
        rights = list(_expressions(numbers[cut:]))
        for (lv, lt), (rv, rt) in itertools.product(lefts, rights):
            for op in _PRECEDENCE:
                value = _combine(op, lv, rv)
                if value is not None:
                    yield value, _render(op, lt, rt)


def solve(numbers: Sequence[int], target: int) -> list[str]:
    """Every countdown solution of ``numbers`` and ``target``: the expressions that use each
    number exactly once (in any order), with ``+ - * /`` and any bracketing, whose exact
    (rational) value is ``target``, written with the fewest parentheses and no spaces; sorted,
    without duplicates (``3*4-2`` once, though two bracketings of the same order write it).

    reasoning-gym's scorer (``sympy.parse_expr``, then the numbers used against the puzzle's)
    gives each of them full credit; tests/test_countdown.py checks that on generated puzzles.

    Args:
        numbers: The puzzle's numbers (``entry["metadata"]["numbers"]``), 1 to 6 of them.
        target: The target.

    Raises:
        ValueError: No number or more than 6 (7 numbers are millions of expressions).
    """
    if not 1 <= len(numbers) <= 6:
        raise ValueError(f"solve: {len(numbers)} numbers; give 1 to 6 (the enumeration grows as n! x Catalan(n-1) x 4^(n-1)).")
    found = set()
    for order in set(itertools.permutations(numbers)):
        for value, (text, _) in _expressions(tuple(order)):
            if value == target:
                found.add(text)
    return sorted(found)


@dataclass(frozen=True)
class CountdownSFT:
    """The countdown part of a warm start's SFT data (:func:`sft_examples`).

    Args:
        config: reasoning-gym's ``CountdownConfig`` fields, as ``(name, value)`` pairs (a frozen
            spec; e.g. ``(("min_numbers", 3), ("max_numbers", 3))``).
        size: Puzzles of the train split (``rllib_dph/ReasoningGym-v0``'s ``size``).
        seed: Its ``seed``.
        solutions_per_prompt: Solutions written per puzzle, at most (fewer where the puzzle has
            fewer shapes).
        draw_seed: Seed of the choice of solutions.
    """

    config: tuple[tuple[str, object], ...]
    size: int = 2000
    seed: int = 0
    solutions_per_prompt: int = 4
    draw_seed: int = 0

    def env_config(self, **extra) -> dict:
        """The ``rllib_dph/ReasoningGym-v0`` env config of these puzzles (``extra``: e.g. ``split``)."""
        return {"dataset": "countdown", "config": dict(self.config), "size": self.size, "seed": self.seed, **extra}


#: The puzzles of the ``tiny-countdown`` warm start and of the countdown budgets of
#: research/reproduce_dph.py: 3 numbers of 1-20, targets 1-100, the first 2,000 of seed 0,
#: up to 8 solutions of different shapes each (8,968 rows).
TINY_COUNTDOWN = CountdownSFT(
    config=(("min_numbers", 3), ("max_numbers", 3), ("min_value", 1), ("max_value", 20), ("min_target", 1),
            ("max_target", 100)),
    size=2000, solutions_per_prompt=8,
)


def choose_solutions(solutions: Sequence[str], numbers: Sequence[int], count: int, rng: np.random.Generator) -> list[str]:
    """Up to ``count`` of ``solutions``, each of another shape (``countdown_shape``) where there
    are that many shapes: shapes are drawn uniformly without replacement, then one solution of
    each, so a rare shape is as likely to be written as a common one."""
    from rllib_dph.envs.reasoning_gym import countdown_shape

    by_shape: dict[tuple, list[str]] = {}
    for text in solutions:
        by_shape.setdefault(countdown_shape(text, numbers), []).append(text)
    shapes = sorted(by_shape, key=repr)
    chosen = []
    for i in rng.permutation(len(shapes))[:count]:
        group = by_shape[shapes[i]]
        chosen.append(group[int(rng.integers(len(group)))])
    return chosen


def sft_examples(spec: CountdownSFT) -> list[dict]:
    """The SFT rows of ``spec``: for every puzzle of the train split, up to
    ``solutions_per_prompt`` solutions (:func:`solve`, :func:`choose_solutions`), each written as
    ``<answer>expression</answer>``, the answer format of reasoning-gym's default system prompt.

    Returns:
        Dicts ``{"messages", "completion", "style", "task_id"}`` as ``suites.sft_examples`` gives
        them: ``messages`` the env's own prompt, ``style`` the solution's
        ``countdown_style``. A puzzle without a solution (none in reasoning-gym's generator, whose
        target is the value of an expression over the numbers) gives no row.
    """
    from rllib_dph.envs.reasoning_gym import ReasoningGymEnv, countdown_style

    env = ReasoningGymEnv("countdown", config=dict(spec.config), size=spec.size, seed=spec.seed, split="train")
    rng = np.random.default_rng(spec.draw_seed)
    rows = []
    for task in env.tasks:
        meta = task.ground_truth["metadata"]
        for text in choose_solutions(solve(meta["numbers"], meta["target"]), meta["numbers"], spec.solutions_per_prompt, rng):
            completion = f"<answer>{text}</answer>"
            rows.append({"messages": [dict(m) for m in task.messages], "completion": completion,
                         "style": countdown_style(completion, task), "task_id": task.id})
    return rows
