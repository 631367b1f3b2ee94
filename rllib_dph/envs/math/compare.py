"""When two math answers are equal, decided without Math-Verify where that is safe.

Two answers are equal when

1. both are plain numbers (``-3``, ``0.75``, ``3/4``, ``\\frac{3}{4}``) with equal values, or they
   are the same string after removing spacing commands (fast path, no Math-Verify call), or
2. Math-Verify's ``parse`` + ``verify`` says so (fractions, decimals, percentages, radicals, tuples,
   sets, LaTeX variants; :func:`math_verify_equal`). Two *exact* plain numbers (no decimal
   point) that differ are unequal without asking Math-Verify.

Math-Verify runs in a checker of the verifier isolation (``rllib_dph.envs.isolation``), under a
CPU-time limit; its own timeouts (``signal.alarm``, main thread only) are switched off.
"""

from __future__ import annotations

import decimal
import logging
import numbers
import re
from collections import OrderedDict
from fractions import Fraction
from typing import Any

from rllib_dph.envs.data.loaders import number_text
from rllib_dph.envs.math.extract import balanced, extract_boxed

_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}")
_SPACING = re.compile(r"\s+|\\[,;:! ]|\\(?:left|right)(?![A-Za-z])")  # not \leftarrow


def _gold_text(gold_answer: Any) -> str:
    """The gold answer as a string; a boxed gold is unboxed and surrounding ``$`` removed; a
    number written by :func:`~rllib_dph.envs.data.loaders.number_text` (never in exponent form).

    Raises:
        ValueError: The gold is None, NaN or infinite: no answer can equal it (its text,
            ``"None"`` or ``"nan"``, must not score 1).
    """
    if gold_answer is None:
        raise ValueError("the gold answer is None; no answer can equal it")
    if isinstance(gold_answer, (numbers.Real, decimal.Decimal)) and not isinstance(gold_answer, bool):
        try:
            return number_text(gold_answer)
        except ValueError as error:
            raise ValueError(f"the gold answer {error}") from None
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


#: Parsed gold answers a checker keeps (a gold is parsed once, then compared with many answers).
GOLD_CACHE_SIZE = 4096
_gold_cache: OrderedDict[str, list] = OrderedDict()


def _parsed(text: str) -> list:
    from math_verify import parse

    return parse("\\boxed{" + text + "}", parsing_timeout=None)


def math_verify_equal(gold: str, pred: str) -> tuple[bool, str | None]:
    """Whether Math-Verify's ``parse`` + ``verify`` says ``pred`` equals ``gold``: ``(equal,
    None)``, or ``(False, reason)`` when it cannot parse one of them or fails. Runs in a checker
    (:func:`rllib_dph.envs.math.env.verify_math` calls it there)."""
    from math_verify import verify

    try:
        gold_parsed = _gold_cache.get(gold)
        if gold_parsed is None:
            gold_parsed = _gold_cache[gold] = _parsed(gold)
            if len(_gold_cache) > GOLD_CACHE_SIZE:
                _gold_cache.popitem(last=False)
        if not gold_parsed:
            return False, "Math-Verify cannot parse the gold answer"
        if not balanced(pred):  # "1}+\boxed{2" would box a second answer once wrapped
            return False, "the answer's braces are unbalanced"
        pred_parsed = _parsed(pred)
        if not pred_parsed:
            return False, "Math-Verify cannot parse the answer"
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None)), None
    except Exception as error:  # RecursionError, MemoryError, SymPy errors, ...
        return False, f"Math-Verify failed: {type(error).__name__}"


#: Pairs a math checker compares once before its first check (:func:`load_math_verify`): each
#: kind loads SymPy code lazily on first use (a first ``x^2`` costs 0.15 s of CPU, most of a
#: small ``timeout_s``), which must not be charged to a model's answer.
WARM_UP_PAIRS = (("\\frac{1}{2}", "0.5"), ("x^2", "x^{2}"), ("2\\sqrt{2}", "\\sqrt{8}"),
                 ("\\{1,2\\}", "\\{2,1\\}"), ("(1,2)", "(1, 2)"))


def load_math_verify() -> None:
    """Imports Math-Verify, loads its LaTeX grammar and compares :data:`WARM_UP_PAIRS` (the
    ``prepare`` of a math checker: not charged to the first check's time limit); its own logging
    of timeouts is silenced."""
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    for gold, pred in WARM_UP_PAIRS:
        math_verify_equal(gold, pred)
