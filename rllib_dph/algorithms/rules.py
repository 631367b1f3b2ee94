"""Rules for numeric config fields, as data: type, finiteness and range, with a fix for each.

``GRPOConfig.validate()`` and ``DPHConfig.validate()`` check their fields against these tables
before any cross-field rule, so every numeric field is refused for the same reasons with the
same kind of message: the field, the value, the rule and a fix. NaN never passes (every bound
is checked with a comparison that NaN fails), and neither does a string or a bool where a
number is due.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Optional


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
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def message(self, value: Any) -> str:
        """The error for a value that breaks the rule: field, value, rule and fix."""
        typed = f" ({type(value).__name__})" if isinstance(value, (str, bool)) else ""
        fix = f"; {self.fix}" if self.fix else ""
        return f"{self.field}={value!r}{typed} is invalid: it must be {self.describe()}{fix}."


def first_violation(config: Any, rules: Iterable[NumberRule]) -> Optional[str]:
    """The message of the first rule ``config`` breaks, or None when all hold."""
    for rule in rules:
        value = getattr(config, rule.field)
        if not rule.holds(value):
            return rule.message(value)
    return None


#: RLlib fields and GRPO's own numeric fields (see ``GRPOConfig``'s docstrings).
GRPO_RULES = (
    NumberRule("lr", low=0, low_open=True, fix="a learning rate such as 3e-4 (tiny model) or 1e-6 (7B)"),
    NumberRule("grad_clip", low=0, low_open=True, optional=True, fix="e.g. 1.0, or None to disable clipping"),
    NumberRule("num_epochs", integer=True, low=1, fix="1 for one pass over each batch"),
    NumberRule("minibatch_size", integer=True, low=1, optional=True, fix="e.g. 32 rows, or None for one step per batch"),
    NumberRule("num_learners", integer=True, low=0, fix="0 for a local learner, N for N Ray learners"),
    NumberRule("group_size", integer=True, low=2, fix="GRPO needs >= 2 completions per prompt, e.g. 8"),
    NumberRule("prompts_per_step", integer=True, low=1, fix="e.g. 16"),
    NumberRule("max_dynamic_sampling_rounds", integer=True, low=1, fix="e.g. 4"),
    NumberRule("temperature", low=0, low_open=True, fix="e.g. 1.0 (0 would be greedy: equal completions, no advantages)"),
    NumberRule("top_p", low=0, high=1, low_open=True, fix="1.0 disables nucleus sampling"),
    NumberRule("max_response_length", integer=True, low=1, fix="e.g. 128"),
    NumberRule("overlong_buffer_length", integer=True, low=0, fix="0 disables DAPO's overlong shaping"),
    NumberRule("clip_eps_low", low=0, high=1, high_open=True, fix="typical 0.2 (1 - clip_eps_low must stay > 0)"),
    NumberRule("clip_eps_high", low=0, fix="typical 0.2, or 0.28 for DAPO clip-higher"),
    NumberRule("clip_ratio_c", low=1, low_open=True, optional=True, fix="dual clip: 3.0 as in verl, or None to disable"),
    NumberRule("is_truncation", low=0, low_open=True, allow_inf=True, fix="math.inf disables truncation; CISPO uses e.g. 5"),
    NumberRule("rollout_top_k", integer=True, low=0, high=20, fix="0 for none, 20 for the top-K DPPO masks"),
    NumberRule("kl_coeff", low=0, fix="0 disables the KL penalty (RKL baseline: 0.01)"),
    NumberRule("entropy_coeff", low=0, fix="0 disables the entropy bonus"),
    NumberRule("max_consecutive_skipped_updates", integer=True, low=1, fix="default 5"),
    NumberRule("max_tokens_per_microbatch", integer=True, low=1, optional=True, fix="e.g. 16384, or None for one pass per mini-batch"),
    NumberRule("val_interval", integer=True, low=0, fix="0 disables validation"),
    NumberRule("val_n", integer=True, low=1, fix="e.g. 8 samples per validation prompt"),
    NumberRule("val_limit", integer=True, low=1, optional=True, fix="None evaluates every validation prompt"),
)

#: DPPO thresholds δ by the divergence of the trust region (DPPO Appendix F: TV 0.15, KL 0.05).
DELTA_RULES = {
    "tv": dict(low=0, high=1, low_open=True, high_open=True, optional=True, fix="None for the default 0.15"),
    "kl": dict(low=0, low_open=True, optional=True, fix="None for the default 0.05"),
}

#: DPH-RL's own numeric fields (see ``DPHConfig.dph``).
DPH_RULES = (
    NumberRule("pef_coeff", low=0, fix="η of the paper, 0.01-0.2"),
    NumberRule("alpha", low=0, high=1, low_open=True, high_open=True, fix="α of the α-divergence, e.g. 0.5"),
    NumberRule("pef_ratio", low=0, low_open=True, fix="exploration rows per D_pef row, paper: 8"),
    NumberRule("presample_k", integer=True, low=1, fix="paper: 8 samples per prompt"),
    NumberRule("presample_min_correct", integer=True, low=1, fix="paper: 7 of 8"),
)
