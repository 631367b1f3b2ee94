"""The kinds of config rule: numeric fields, choices and cross-field rules, each with its message.

Each config keeps its rule tables beside its setters (``GRPOConfig.llm_rules``,
``training_rules``, ..., ``DPHConfig.dph_rules``; ``GRPOConfig.rules`` joins them), and
``validate()`` runs them: first the numeric rules (``NumberRule``: type, finiteness and range),
then the others in order (``ChoiceRule``: a name from a registry;
``grpo.trust_region.TrustRegionRule``: the grouped trust-region setting; ``CrossRule``: rules
across fields). Every message states the field, the value, the rule and a fix. NaN never passes a number
rule (every bound is checked with a comparison that NaN fails), and neither does a string or a
bool where a number is due, nor a number beyond what a later wait or tensor can hold
(:data:`MAX_INT`, :data:`MAX_REAL`). ``BoolRule`` takes ``True`` or ``False`` alone: the string
``"false"`` of a config file is refused, not read as true.
"""

from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Iterator, Optional

#: The largest int any numeric field takes: sizes and counts beyond it overflow the int32 and
#: int64 arithmetic of tensors built from them.
MAX_INT = 2**31 - 1
#: The largest finite real any numeric field takes: the longest wait Python can make
#: (``threading.TIMEOUT_MAX``, about 292 years in seconds); a timeout beyond it fails when the
#: wait starts, hours into a run.
MAX_REAL = threading.TIMEOUT_MAX


@dataclass(frozen=True)
class NumberRule:
    """One numeric field's rule.

    Attributes:
        field: The config attribute.
        integer: An int is due (a bool or a float such as 2.5 or 8.0 is refused); else any real.
        low, high: Bounds, None for none.
        low_open, high_open: Whether a bound itself is excluded.
        optional: None is allowed (it means "off" or "default", see the field's docstring).
        allow_inf: +inf is allowed (e.g. "no truncation").
        fix: What to set instead, appended to the message.
    """

    field: str
    integer: bool = False
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    allow_inf: bool = False
    fix: str = ""

    def describe(self) -> str:
        """The rule in words, e.g. 'a finite number in (0, 1]' or 'an int >= 2'."""
        kind = "an int" if self.integer else ("a number" if self.allow_inf else "a finite number")
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            bounds = f" in {left}{self.low}, {self.high}{right}"
        elif self.low is not None:
            bounds = f" {'>' if self.low_open else '>='} {self.low}"
        elif self.high is not None:
            bounds = f" {'<' if self.high_open else '<='} {self.high}"
        else:
            bounds = ""
        text = kind + bounds + (" (math.inf allowed)" if self.allow_inf else "")
        return f"None or {text}" if self.optional else text

    def holds(self, value: Any) -> bool:
        """Whether ``value`` satisfies the rule."""
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        if math.isnan(value) or (math.isinf(value) and not (self.allow_inf and value > 0)):
            return False
        if not math.isinf(value) and abs(value) > self.ceiling:
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def message(self, value: Any) -> str:
        """The error for a value that breaks the rule: field, value, rule and fix."""
        typed = f" ({type(value).__name__})" if isinstance(value, (str, bool)) else ""
        fix = f"; {self.fix}" if self.fix else ""
        return f"{self.field}={value!r}{typed} is invalid: it must be {self.describe()}{self._ceiling(value)}{fix}."

    @property
    def ceiling(self) -> float:
        """The largest magnitude the field takes: :data:`MAX_INT` for an int, else :data:`MAX_REAL`."""
        return MAX_INT if self.integer else MAX_REAL

    def _ceiling(self, value: Any) -> str:
        """``", at most <ceiling>"`` for a finite number beyond :attr:`ceiling`, else ``""``."""
        beyond = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
                  and abs(value) > self.ceiling)
        if not beyond:
            return ""
        return f", at most {self.ceiling}" if self.integer else f", at most {self.ceiling:.3g}"

    def violation(self, config: Any) -> Optional[str]:
        """The message when ``config``'s field breaks the rule, else None."""
        value = getattr(config, self.field)
        return None if self.holds(value) else self.message(value)


@dataclass(frozen=True)
class ChoiceRule:
    """A field whose value must be one of a registry's names.

    Attributes:
        field: The config attribute.
        choices: The allowed values: a registry dict (its keys) or a tuple.
    """

    field: str
    choices: Collection[str]

    def violation(self, config: Any) -> Optional[str]:
        """The message when ``config``'s field is not one of ``choices``, else None (a value of
        another type, e.g. a list holding a choice, is refused like any other)."""
        value = getattr(config, self.field)
        if isinstance(value, str) and value in self.choices:
            return None
        typed = "" if isinstance(value, str) else f" ({type(value).__name__})"
        return f"{self.field}={value!r}{typed} is not one of {list(self.choices)}; pick one of those."


@dataclass(frozen=True)
class BoolRule:
    """A field that is ``True`` or ``False``: a string ("false", "0"), a number or None is refused.

    Attributes:
        field: The config attribute.
    """

    field: str

    def violation(self, config: Any) -> Optional[str]:
        """The message when ``config``'s field is not a bool, else None."""
        value = getattr(config, self.field)
        if isinstance(value, bool):
            return None
        return f"{self.field}={value!r} ({type(value).__name__}) is invalid: it must be True or False."


@dataclass(frozen=True)
class CrossRule:
    """A rule a number or choice rule cannot state: across fields, or about one special value.

    Attributes:
        name: The rule in a few words.
        broken: Whether a config breaks it.
        message: The error for a config that breaks it: the values, the rule and the fix.
    """

    name: str
    broken: Callable[[Any], bool]
    message: Callable[[Any], str]

    def violation(self, config: Any) -> Optional[str]:
        """The message when ``config`` breaks the rule, else None."""
        return self.message(config) if self.broken(config) else None


def violations(config: Any, rules: Iterable[Any]) -> Iterator[str]:
    """The messages of the rules ``config`` breaks, in table order (each rule has ``violation``)."""
    for rule in rules:
        message = rule.violation(config)
        if message is not None:
            yield message


def first_violation(config: Any, rules: Iterable[Any]) -> Optional[str]:
    """The message of the first rule ``config`` breaks, or None when all hold."""
    return next(violations(config, rules), None)
