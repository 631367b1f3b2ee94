"""When two math answers are equal, decided without Math-Verify where that is safe.

Two answers are equal when

1. both are plain numbers (``-3``, ``0.75``, ``3/4``, ``\\frac{3}{4}``) with equal values, or they
   are the same string after removing spacing commands (fast path, no Math-Verify call), or
2. Math-Verify's ``parse`` + ``verify`` says so (fractions, decimals, percentages, radicals, tuples,
   sets, LaTeX variants). Two *exact* plain numbers (no decimal point) that differ are unequal
   without asking Math-Verify.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from rllib_dph.envs.math.extract import extract_boxed

_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}")
_SPACING = re.compile(r"\s+|\\[,;:! ]|\\left|\\right")


def _gold_text(gold_answer: Any) -> str:
    """The gold answer as a string; a boxed gold is unboxed and surrounding ``$`` removed."""
    if isinstance(gold_answer, (int, float, Fraction)) and not isinstance(gold_answer, bool):
        return str(gold_answer)
    text = str(gold_answer).strip()
    boxed = extract_boxed(text)
    return (boxed if boxed is not None else text).strip().strip("$").strip()


def _as_fraction(answer: str) -> Fraction | None:
    """The value of a plain number (``-3``, ``0.75``, ``3/4``, ``\\frac{3}{4}``), else None."""
    latex = _LATEX_FRACTION.fullmatch(answer)
    if latex is not None:
        answer = f"{latex.group(1)}{latex.group(2)}/{latex.group(3)}"
    elif _PLAIN_NUMBER.fullmatch(answer) is None:
        return None
    try:
        return Fraction(answer)
    except (ValueError, ZeroDivisionError):
        return None


def _squash(answer: str) -> str:
    """The answer without spacing, ``\\left`` / ``\\right``, and with ``\\dfrac`` as ``\\frac``."""
    return _SPACING.sub("", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _fast_equal(gold: str, pred: str) -> bool | None:
    """Decides the easy cases without Math-Verify; None when Math-Verify must decide."""
    g, p = _as_fraction(gold), _as_fraction(pred)
    if g is not None and p is not None:
        if g == p:
            return True
        if "." not in gold and "." not in pred:
            return False  # two different exact numbers (Math-Verify would round decimals)
        return None
    if _squash(gold) == _squash(pred):
        return True
    return None
