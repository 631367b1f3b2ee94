"""The synthetic math suite: short word problems with exact answers and three solution styles.

Every problem comes with one worked solution per style of :data:`MATH_STYLES`, each ending in
``\\boxed{answer}``. A style is recognised from the solution's first words:

=========  ==============================================  ==========
style      example                                         first words
=========  ==============================================  ==========
direct     ``We compute 12 + 3*5 - 7 = 20.``                ``We compute``
stepwise   ``Step 1: 3*5 = 15.`` / ``Step 2: ...``          ``Step 1:``
equation   ``Let x be the number. Then 4x - 6 = 18, ...``   ``Let x``
=========  ==============================================  ==========

Answers are integers (possibly negative) or fractions in lowest terms, written ``12``, ``-5``,
``\\frac{3}{4}`` or ``-\\frac{3}{4}``. Test and train questions never share a question text.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

MATH_STYLES: tuple[str, ...] = ("direct", "stepwise", "equation")
SPLIT_SIZES = {"train": 3000, "test": 300}
SPLIT_SEED = 11
INSTRUCTION = "Solve briefly and put the final answer in \\boxed{}."

_STYLE_STARTS = (("direct", "We compute"), ("stepwise", "Step 1:"), ("equation", "Let x"))
_BOXED = re.compile(r"\\boxed\{")

_NAMES = ("Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kai", "Lena")
_ITEMS = ("apples", "stamps", "marbles", "cards", "pens", "shells", "stickers", "coins")
_LIQUIDS = ("juice", "water", "milk", "soup", "paint", "tea")


@dataclass(frozen=True)
class MathProblem:
    """One generated problem.

    Attributes:
        template: Name of the problem generator.
        question: The problem text.
        answer: The exact answer.
        styles: Worked solution per style, each ending in ``\\boxed{...}``.
    """

    template: str
    question: str
    answer: Fraction
    styles: dict[str, str]

    @property
    def prompt(self) -> str:
        """The user message: the question and the answer-format instruction."""
        return f"{self.question}\n{INSTRUCTION}"

    @property
    def answer_latex(self) -> str:
        """The answer as the string inside ``\\boxed{}`` (and the task's ground truth)."""
        return latex(self.answer)


def latex(value: Fraction) -> str:
    """Write an exact number as ``12``, ``-5``, ``\\frac{3}{4}`` or ``-\\frac{3}{4}``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def plain(value: Fraction) -> str:
    """Write an exact number in running text: ``12``, ``-5``, ``3/4``, ``-3/4``."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _p(value: int | Fraction) -> str:
    """A number inside an expression, parenthesised when negative: ``(-3)``."""
    text = plain(Fraction(value))
    return f"({text})" if value < 0 else text


def _ratio(num: int, den: int) -> str:
    """``num/den``, followed by ``= <lowest terms>`` when the fraction reduces."""
    value = Fraction(num, den)
    text = f"{num}/{_p(den)}"
    return text if (value.numerator, value.denominator) == (num, den) else f"{text} = {plain(value)}"


def _linear(a: int, b: int) -> str:
    """``a x + b`` written as ``3x - 5`` (a != 0)."""
    head = "x" if a == 1 else "-x" if a == -1 else f"{a}x"
    if b == 0:
        return head
    return f"{head} + {b}" if b > 0 else f"{head} - {-b}"


def _solutions(direct: str, steps: list[str], equation: str, answer: Fraction) -> dict[str, str]:
    boxed = f"\\boxed{{{latex(answer)}}}"
    stepwise = "\n".join(f"Step {i}: {s}" for i, s in enumerate(steps, 1))
    return {
        "direct": f"We compute {direct}.\n{boxed}",
        "stepwise": f"{stepwise}\n{boxed}",
        "equation": f"Let x be {equation}.\n{boxed}",
    }


# ---------------------------------------------------------------------------------------------
# Problem generators: each draws its numbers from ``rng`` and returns (question, answer, styles).

Generated = tuple[str, Fraction, dict[str, str]]


def _shopping(rng: random.Random) -> Generated:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c = rng.randint(2, 40), rng.randint(2, 9), rng.randint(2, 12)
    d = rng.randint(1, a + b * c - 1)
    ans = Fraction(a + b * c - d)
    q = (f"{name} has {a} {item}, buys {b} packs of {c} {item} and gives away {d}. "
         f"How many {item} does {name} have now?")
    return q, ans, _solutions(
        f"{a} + {b}*{c} - {d} = {plain(ans)}",
        [f"{b}*{c} = {b * c}.", f"{a} + {b * c} = {a + b * c}.", f"{a + b * c} - {d} = {plain(ans)}."],
        f"the number of {item}. Then x = {a} + {b}*{c} - {d}, so x = {plain(ans)}", ans)


def _temperature(rng: random.Random) -> Generated:
    t, a, b = rng.randint(-10, 15), rng.randint(3, 25), rng.randint(1, 20)
    ans = Fraction(t - a + b)
    q = (f"The temperature is {t} degrees. It falls by {a} degrees and then rises by {b} degrees. "
         f"What is the temperature now?")
    return q, ans, _solutions(
        f"{t} - {a} + {b} = {plain(ans)}",
        [f"{t} - {a} = {t - a}.", f"{t - a} + {b} = {plain(ans)}."],
        f"the final temperature. Then x = {t} - {a} + {b}, so x = {plain(ans)}", ans)


def _linear_equation(rng: random.Random) -> Generated:
    a, c = rng.sample([k for k in range(-9, 10) if k != 0], 2)
    b, d = rng.randint(-20, 20), rng.randint(-20, 20)
    ans = Fraction(d - b, a - c)
    q = f"Solve for x: {_linear(a, b)} = {_linear(c, d)}."
    return q, ans, _solutions(
        f"x = ({d} - {_p(b)})/({a} - {_p(c)}) = {plain(ans)}",
        [f"{a}x - {_p(c)}x = {d} - {_p(b)}, so {a - c}x = {d - b}.", f"x = {_ratio(d - b, a - c)}."],
        f"the unknown. Then {a - c}x = {d - b}, so x = {plain(ans)}", ans)


def _reverse_puzzle(rng: random.Random) -> Generated:
    a, b, c = rng.randint(2, 12), rng.randint(1, 30), rng.randint(-20, 90)
    ans = Fraction(c - b, a)
    q = (f"A number is multiplied by {a} and then {b} is added. The result is {c}. "
         f"What is the number?")
    return q, ans, _solutions(
        f"({c} - {b})/{a} = {plain(ans)}",
        [f"{c} - {b} = {c - b}.", f"{_ratio(c - b, a)}."],
        f"the number. Then {a}x + {b} = {c}, so x = {plain(ans)}", ans)


def _sharing(rng: random.Random) -> Generated:
    liquid, a, b = rng.choice(_LIQUIDS), rng.randint(1, 30), rng.randint(2, 12)
    ans = Fraction(a, b)
    q = f"{a} liters of {liquid} are shared equally among {b} cups. How many liters go in each cup?"
    return q, ans, _solutions(
        _ratio(a, b),
        [f"Each cup gets {a}/{b} liters.", f"{_ratio(a, b)}."],
        f"the liters per cup. Then {b}x = {a}, so x = {plain(ans)}", ans)


def _fraction_sum(rng: random.Random) -> Generated:
    q1, q2 = rng.randint(2, 9), rng.randint(2, 9)
    p1, p2 = rng.randint(1, q1 - 1), rng.randint(1, q2 - 1)
    op = rng.choice("+-")
    sign = 1 if op == "+" else -1
    ans = Fraction(p1, q1) + sign * Fraction(p2, q2)
    den = q1 * q2
    num = p1 * q2 + sign * p2 * q1
    q = f"What is {p1}/{q1} {op} {p2}/{q2}?"
    return q, ans, _solutions(
        f"{p1}/{q1} {op} {p2}/{q2} = {_ratio(num, den)}",
        [f"{p1}/{q1} = {p1 * q2}/{den} and {p2}/{q2} = {p2 * q1}/{den}.",
         f"{p1 * q2} {op} {p2 * q1} = {num}, so the result is {_ratio(num, den)}."],
        f"the result. Then x = {_ratio(num, den)}", ans)


def _fraction_product(rng: random.Random) -> Generated:
    q1, q2 = rng.randint(2, 9), rng.randint(2, 9)
    p1, p2 = rng.randint(1, q1 - 1), rng.randint(1, q2 - 1)
    ans = Fraction(p1 * p2, q1 * q2)
    q = f"What is {p1}/{q1} of {p2}/{q2}?"
    return q, ans, _solutions(
        f"{p1}/{q1} * {p2}/{q2} = {_ratio(p1 * p2, q1 * q2)}",
        [f"{p1}*{p2} = {p1 * p2} and {q1}*{q2} = {q1 * q2}.", f"The result is {_ratio(p1 * p2, q1 * q2)}."],
        f"the result. Then x = {p1}/{q1} * {p2}/{q2} = {_ratio(p1 * p2, q1 * q2)}", ans)


def _average(rng: random.Random) -> Generated:
    a, b, m = rng.randint(-10, 40), rng.randint(-10, 40), rng.randint(0, 30)
    ans = Fraction(3 * m - a - b)
    q = f"The average of {a}, {b} and x is {m}. What is x?"
    return q, ans, _solutions(
        f"3*{m} - {_p(a)} - {_p(b)} = {plain(ans)}",
        [f"The sum is 3*{m} = {3 * m}.", f"{3 * m} - {_p(a)} - {_p(b)} = {plain(ans)}."],
        f"the missing number. Then ({a} + {b} + x)/3 = {m}, so x = {plain(ans)}", ans)


def _percent(rng: random.Random) -> Generated:
    p, n = rng.choice((5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 12, 35)), rng.randint(2, 80) * 2
    ans = Fraction(p * n, 100)
    q = f"What is {p}% of {n}?"
    return q, ans, _solutions(
        f"{p}*{n}/100 = {plain(ans)}",
        [f"{p}% of {n} is {p}*{n}/100.", f"{_ratio(p * n, 100)}."],
        f"the result. Then x = {p}/100 * {n} = {plain(ans)}", ans)


def _two_numbers(rng: random.Random) -> Generated:
    k, s = rng.randint(2, 6), rng.randint(6, 90)
    ans = Fraction(s, k + 1)
    q = f"Two numbers add up to {s}, and one is {k} times the other. What is the smaller number?"
    return q, ans, _solutions(
        f"{s}/({k} + 1) = {plain(ans)}",
        [f"There are {k} + 1 = {k + 1} equal parts.", f"{_ratio(s, k + 1)}."],
        f"the smaller number. Then x + {k}x = {s}, so {k + 1}x = {s} and x = {plain(ans)}", ans)


def _trip(rng: random.Random) -> Generated:
    v, t, u, w = rng.randint(20, 90), rng.randint(2, 6), rng.randint(20, 90), rng.randint(2, 6)
    ans = Fraction(v * t + u * w)
    q = f"A bus drives {t} hours at {v} km/h and then {w} hours at {u} km/h. How many km does it drive?"
    return q, ans, _solutions(
        f"{t}*{v} + {w}*{u} = {plain(ans)}",
        [f"{t}*{v} = {t * v}.", f"{w}*{u} = {w * u}.", f"{t * v} + {w * u} = {plain(ans)}."],
        f"the distance. Then x = {t}*{v} + {w}*{u}, so x = {plain(ans)}", ans)


GENERATORS: dict[str, Callable[[random.Random], Generated]] = {
    "shopping": _shopping,
    "temperature": _temperature,
    "linear_equation": _linear_equation,
    "reverse_puzzle": _reverse_puzzle,
    "sharing": _sharing,
    "fraction_sum": _fraction_sum,
    "fraction_product": _fraction_product,
    "average": _average,
    "percent": _percent,
    "two_numbers": _two_numbers,
    "trip": _trip,
}


@functools.lru_cache(maxsize=None)
def _all_problems() -> tuple[MathProblem, ...]:
    """Distinct problems for every split, test first, from generators drawn at random."""
    rng = random.Random(SPLIT_SEED)
    wanted = sum(SPLIT_SIZES.values())
    seen: set[str] = set()
    problems: list[MathProblem] = []
    names = list(GENERATORS)
    while len(problems) < wanted:
        name = rng.choice(names)
        question, answer, styles = GENERATORS[name](rng)
        if question in seen:
            continue
        seen.add(question)
        problems.append(MathProblem(name, question, answer, styles))
    return tuple(problems)


def problems(split: str) -> tuple[MathProblem, ...]:
    """All problems of a split, in their fixed order.

    Args:
        split: ``"train"`` or ``"test"``.
    """
    if split not in SPLIT_SIZES:
        raise ValueError(f"Unknown math split {split!r}; use one of {tuple(SPLIT_SIZES)}.")
    everything = _all_problems()
    n_test = SPLIT_SIZES["test"]
    return everything[:n_test] if split == "test" else everything[n_test:]


def math_style(completion: str) -> str:
    """Name the solution style of a math completion.

    Args:
        completion: The model's whole answer.

    Returns:
        ``"none"`` when it has no ``\\boxed{``, the style whose opening words it starts with,
        else ``"other"``.
    """
    if not _BOXED.search(completion):
        return "none"
    text = completion.lstrip()
    for style, start in _STYLE_STARTS:
        if text.startswith(start):
            return style
    return "other"
