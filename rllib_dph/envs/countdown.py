"""A countdown solver and the supervised examples of a countdown warm start.

reasoning-gym's countdown data set gives one solution per puzzle (the expression it generated the
target from). A base policy that solves a puzzle in several ways needs several: :func:`solve`
enumerates every expression over the puzzle's numbers (each used once, ``+ - * /``, any order and
any bracketing) whose exact value is the target, and :func:`sft_examples` writes a sample of them,
of different shapes (:func:`rllib_dph.envs.reasoning_gym.countdown_style`: operator pattern,
parentheses, number order), as the answers of the train split's prompts, so that the SFT of a
warm start (``rllib_dph.models.build.warm_start``, ``WarmStartSpec.countdown``) teaches every shape a
puzzle allows. Puzzles, prompts and the scorer stay reasoning-gym's: the examples' prompts are
the env's own (``rllib_dph/ReasoningGym-v0``, split ``"train"``).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator, Optional, Sequence

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


#: One step of a worked solution: (left value, operator, right value, result).
Step = tuple[Fraction, str, Fraction, Fraction]


def _expressions(numbers: tuple[int, ...]) -> Iterator[tuple[Fraction, tuple[str, int], tuple[Step, ...]]]:
    """Every (value, (text, precedence), steps) over ``numbers`` in this order, each number
    once, every binary bracketing and operator choice; ``steps`` are its operations in the order
    they are computed (left side, right side, then this one). Sub-expressions that divide by
    zero are left out."""
    if len(numbers) == 1:
        yield Fraction(numbers[0]), (str(numbers[0]), _ATOM), ()
        return
    for cut in range(1, len(numbers)):
        lefts = list(_expressions(numbers[:cut]))
        rights = list(_expressions(numbers[cut:]))
        for (lv, lt, ls), (rv, rt, rs) in itertools.product(lefts, rights):
            for op in _PRECEDENCE:
                value = _combine(op, lv, rv)
                if value is not None:
                    yield value, _render(op, lt, rt), ls + rs + ((lv, op, rv, value),)


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
    return sorted(_solutions(numbers, target, natural_steps=False))


def worked_solutions(numbers: Sequence[int], target: int) -> dict[str, str]:
    """The solutions of :func:`solve` that are worked out in whole numbers, each with its
    working (:func:`working`, as the text reads), every result a whole number >= 0 (the classic
    countdown rule), e.g. ``"14*9=126 126/2=63"`` for ``14*9/2``. ``7/2*4`` (7/2 is 3.5) and
    ``3-(9-19)`` (9-19 is -10) are left out.

    Returns:
        ``{expression: working}``, sorted by expression.
    """
    return _solutions(numbers, target, natural_steps=True)


_AST_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def working(expression: str) -> tuple[Step, ...]:
    """The operations of an arithmetic text as it reads (precedence, then left to right), in the
    order they are computed: ``"9+20-7"`` is ``9+20=29 29-7=22``, ``"9+(20-7)"`` is
    ``20-7=13 9+13=22``. ``expression`` is parsed, never evaluated as code.

    Raises:
        ValueError: ``expression`` is not integer arithmetic with ``+ - * /`` and parentheses.
    """
    def walk(node) -> tuple[Fraction, tuple[Step, ...]]:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value), ()
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPERATORS:
            (lv, ls), (rv, rs), op = walk(node.left), walk(node.right), _AST_OPERATORS[type(node.op)]
            value = _combine(op, lv, rv)
            if value is None:
                raise ValueError(f"working: {expression!r} divides by zero.")
            return value, ls + rs + ((lv, op, rv, value),)
        raise ValueError(f"working: {expression!r} is not integer arithmetic with + - * / and parentheses.")

    return walk(ast.parse(expression, mode="eval").body)[1]


def _solutions(numbers: Sequence[int], target: int, *, natural_steps: bool) -> dict[str, str]:
    """``{expression: working}`` of every solution (:func:`solve`), only those whose working
    (:func:`working`, as the text reads) is in whole numbers >= 0 when ``natural_steps`` (the
    working of others is empty)."""
    if not 1 <= len(numbers) <= 6:
        raise ValueError(f"solve: {len(numbers)} numbers; give 1 to 6 (the enumeration grows as n! x Catalan(n-1) x 4^(n-1)).")
    texts = {text for order in set(itertools.permutations(numbers))
             for value, (text, _), _ in _expressions(tuple(order)) if value == target}
    found: dict[str, str] = {}
    for text in sorted(texts):
        steps = working(text)
        if all(result.denominator == 1 and result >= 0 for *_, result in steps):
            found[text] = " ".join(f"{a}{op}{b}={r}" for a, op, b, r in steps)
        elif not natural_steps:
            found[text] = ""
    return found


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
        worked: Write each solution's working before its answer (:func:`worked_solutions`,
            ``"14*9=126 126/2=63"`` on a line of its own, which reasoning-gym's default system
            prompt invites: "thinking step-by-step", then the answer in ``<answer>`` tags), and
            use only the solutions worked out in whole numbers; False: the answer alone, of
            every solution.
        held_out: ``(size, train_size)`` of the env's test split at ``seed``: its questions are
            left out of these puzzles, so that a pool larger than the RL train split shares no
            question with the held-out puzzles; None: every puzzle of the train split.
    """

    config: tuple[tuple[str, object], ...]
    size: int = 2000
    seed: int = 0
    solutions_per_prompt: int = 4
    draw_seed: int = 0
    worked: bool = False
    held_out: Optional[tuple[int, int]] = None

    def env_config(self, **extra) -> dict:
        """The ``rllib_dph/ReasoningGym-v0`` env config of these puzzles (``extra``: e.g. ``split``)."""
        return {"dataset": "countdown", "config": dict(self.config), "size": self.size, "seed": self.seed, **extra}


#: The countdown puzzles of the tuned examples and of the countdown budgets of
#: research/reproduce_dph.py: 3 numbers of 1-20, targets 1-100, the first 2,000 of seed 0 (its
#: held-out puzzles: the test split of 300 against these 2,000).
TINY_COUNTDOWN = CountdownSFT(
    config=(("min_numbers", 3), ("max_numbers", 3), ("min_value", 1), ("max_value", 20), ("min_target", 1),
            ("max_target", 100)),
    size=2000,
)

#: The SFT puzzles of the ``tiny-countdown`` warm start: the first 8,000 of seed 0 (the 2,000 of
#: :data:`TINY_COUNTDOWN` and 6,000 more) less the 6 whose question is one of the 300 held-out
#: puzzles, with up to 4 solutions of different shapes each (27,819 rows).
TINY_COUNTDOWN_SFT = dataclasses.replace(TINY_COUNTDOWN, size=8000, held_out=(300, TINY_COUNTDOWN.size))

#: The SFT puzzles of ``tiny-countdown-long``, which continues ``tiny-countdown``: the first
#: 16,000 of seed 0 less the held-out ones, with other solutions drawn (``draw_seed`` 1).
TINY_COUNTDOWN_SFT_LONG = dataclasses.replace(TINY_COUNTDOWN_SFT, size=16000, draw_seed=1)

#: The SFT puzzles of ``tiny-countdown-pef``, which continues ``tiny-countdown-long``: the 2,000
#: RL training puzzles of :data:`TINY_COUNTDOWN` alone, with up to 8 solutions of different
#: shapes each (``draw_seed`` 2; 8,968 rows), so that the base solves some of its own training
#: puzzles reliably, as D_pef needs.
TINY_COUNTDOWN_SFT_PEF = dataclasses.replace(TINY_COUNTDOWN, solutions_per_prompt=8, draw_seed=2,
                                             held_out=(300, TINY_COUNTDOWN.size))

#: The SFT puzzles of ``smollm2-135m-countdown``: the 2,000 RL training puzzles of
#: :data:`TINY_COUNTDOWN`, up to 4 solutions of different shapes each, every one written after its
#: working in whole numbers (``worked``: 6,457 rows), so that SmolLM2 computes before it answers.
SMOLLM2_COUNTDOWN_SFT = dataclasses.replace(TINY_COUNTDOWN, worked=True, held_out=(300, TINY_COUNTDOWN.size))


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
    ``<answer>expression</answer>``, the answer format of reasoning-gym's default system prompt
    (with ``spec.worked``, after its working: ``"14*9=126 126/2=63\n<answer>14*9/2</answer>"``).

    Returns:
        Dicts ``{"messages", "completion", "style", "task_id"}`` as ``suites.sft_examples`` gives
        them: ``messages`` the env's own prompt, ``style`` the solution's
        ``countdown_style``. A puzzle whose question is held out (``spec.held_out``) gives no row,
        nor does one without a solution (none in reasoning-gym's generator, whose target is the
        value of an expression over the numbers).
    """
    from rllib_dph.envs.reasoning_gym import ReasoningGymEnv, countdown_style, generate_items

    env = ReasoningGymEnv("countdown", config=dict(spec.config), size=spec.size, seed=spec.seed, split="train")
    held_out = set()
    if spec.held_out is not None:
        size, train_size = spec.held_out
        held_out = {entry["question"] for _, entry in generate_items(
            "countdown", dict(spec.config), size=size, seed=spec.seed, split="test", train_size=train_size)}
    rng = np.random.default_rng(spec.draw_seed)
    rows = []
    for task in (t for t in env.tasks if t.ground_truth["question"] not in held_out):
        meta = task.ground_truth["metadata"]
        solutions = worked_solutions(meta["numbers"], meta["target"]) if spec.worked else dict.fromkeys(
            solve(meta["numbers"], meta["target"]), "")
        for text in choose_solutions(sorted(solutions), meta["numbers"], spec.solutions_per_prompt, rng):
            completion = f"{solutions[text]}\n<answer>{text}</answer>" if spec.worked else f"<answer>{text}</answer>"
            rows.append({"messages": [dict(m) for m in task.messages], "completion": completion,
                         "style": countdown_style(completion, task), "task_id": task.id})
    return rows
