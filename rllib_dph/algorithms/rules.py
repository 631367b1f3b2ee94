"""Config rules as data: numeric fields, choices and cross-field rules, each with its message.

``GRPOConfig.validate()`` and ``DPHConfig.validate()`` run these tables: first the numeric rules
(``NumberRule``: type, finiteness and range), then the config's ``config_rules`` in order
(``ChoiceRule``: a name from a registry; ``grpo.trust_region.TrustRegionRule``: the grouped
trust-region setting; ``CrossRule``: rules across fields). DPH's tables are GRPO's plus its
own. Every message states the field, the value, the rule and a fix. NaN never passes a number
rule (every bound is checked with a comparison that NaN fails), and neither does a string or a
bool where a number is due.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Iterator, Optional

from rllib_dph.engines import DEFAULT_ENGINE, ENGINES


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
        """The message when ``config``'s field is not one of ``choices``, else None."""
        value = getattr(config, self.field)
        if value in self.choices:
            return None
        return f"{self.field}={value!r} is not one of {list(self.choices)}; pick one of those."


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


#: RLlib fields and GRPO's own numeric fields (see ``GRPOConfig``'s docstrings).
GRPO_NUMBER_RULES = (
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
    NumberRule("clip_ratio_c", low=1, low_open=True, optional=True, fix="dual clip: 3.0 as in verl, or None to disable"),
    NumberRule("rollout_top_k", integer=True, low=0, high=20, fix="0 for none, 20 for the top-K DPPO masks"),
    NumberRule("kl_coeff", low=0, fix="0 disables the KL penalty (RKL baseline: 0.01)"),
    NumberRule("entropy_coeff", low=0, fix="0 disables the entropy bonus"),
    NumberRule("max_consecutive_skipped_updates", integer=True, low=1, fix="default 5"),
    NumberRule("max_tokens_per_microbatch", integer=True, low=1, optional=True, fix="e.g. 16384, or None for one pass per mini-batch"),
    NumberRule("val_interval", integer=True, low=0, fix="0 disables validation"),
    NumberRule("val_n", integer=True, low=1, fix="e.g. 8 samples per validation prompt"),
    NumberRule("val_limit", integer=True, low=1, optional=True, fix="None evaluates every validation prompt"),
    NumberRule("max_staleness", integer=True, low=0, fix="0 for synchronous sampling, 1 to overlap sampling and update"),
    NumberRule("sample_timeout_s", low=0, low_open=True, fix="seconds, generous (default 1800)"),
    NumberRule("weight_sync_timeout_s", low=0, low_open=True, fix="seconds, generous (default 600)"),
)

#: DPH-RL's own numeric fields (see ``DPHConfig.dph``).
DPH_NUMBER_RULES = (
    NumberRule("pef_coeff", low=0, fix="η of the paper, 0.01-0.2"),
    NumberRule("alpha", low=0, high=1, low_open=True, high_open=True, fix="α of the α-divergence, e.g. 0.5"),
    NumberRule("pef_ratio", low=0, low_open=True, fix="exploration rows per D_pef row, paper: 8"),
)

#: fp16 training needs loss scaling, which the learner does not do (``GRPOConfig.llm``).
FLOAT16_TRAINING_RULE = CrossRule(
    "no float16 training",
    lambda c: c.dtype == "float16",
    lambda c: (
        "dtype='float16' would train the learner under fp16 autocast, which needs loss "
        "scaling (a GradScaler) against gradient underflow, and this learner has none; "
        "set dtype='bfloat16' (fp32's exponent range: no scaling needed) or 'float32'. "
        "For an fp16 rollout engine only, set engine_kwargs={'dtype': 'float16'}."
    ),
)

#: GRPO's rules across fields (see ``GRPOConfig``'s docstrings).
GRPO_CROSS_RULES = (
    CrossRule(
        "fsdp2 needs two learners",
        lambda c: c.sharding == "fsdp2" and c.num_learners < 2,
        lambda c: (
            f"sharding='fsdp2' shards the model over the Ray learners, but num_learners="
            f"{c.num_learners}; set .learners(num_learners=N) with N >= 2 (e.g. one per "
            "GPU), or sharding='ddp' for a single learner."
        ),
    ),
    CrossRule(
        "fsdp2 clips by a global norm or by value",
        lambda c: c.sharding == "fsdp2" and c.grad_clip is not None and c.grad_clip_by == "norm",
        lambda c: (
            "grad_clip_by='norm' clips each gradient tensor by its own norm, which an FSDP2 "
            "learner only holds a shard of; with sharding='fsdp2' use grad_clip_by="
            "'global_norm' (default) or 'value'."
        ),
    ),
    CrossRule(
        "asynchronous sampling needs remote env runners",
        # RLlib validates an evaluation copy too, whose env runners are the evaluation ones.
        lambda c: c.max_staleness > 0 and c.num_env_runners < 1 and not c.in_evaluation,
        lambda c: (
            f"max_staleness={c.max_staleness} samples on remote env runners while the learners "
            f"update, but num_env_runners={c.num_env_runners} samples in the driver; set "
            ".env_runners(num_env_runners=1) or more, or max_staleness=0."
        ),
    ),
    CrossRule(
        "a prompt per env runner and per learner",
        lambda c: c.prompts_per_step < max(1, c.num_env_runners, c.num_learners),
        lambda c: (
            f"prompts_per_step={c.prompts_per_step} must be >= num_env_runners="
            f"{c.num_env_runners} and >= num_learners={c.num_learners} (every env runner "
            "samples, and every learner trains on, at least one prompt per step)."
        ),
    ),
    CrossRule(
        "nucleus log-probs need top_p = 1",
        lambda c: c.engine in ENGINES and not ENGINES[c.engine].full_softmax_logprobs and c.top_p < 1,
        lambda c: (
            f"engine={c.engine!r} with top_p={c.top_p}: that engine reports log-probs of the top-p-"
            "renormalised nucleus, not of the full tempered softmax the learner's π_θ is "
            "(engines.base.SamplingParams), so π_θ/μ would start at the nucleus mass instead "
            f"of 1; set top_p=1.0 (as DAPO and DPH-RL do) or engine={DEFAULT_ENGINE!r}."
        ),
    ),
    CrossRule(
        "overlong buffer shorter than the response",
        lambda c: c.overlong_buffer_length >= c.max_response_length,
        lambda c: (
            f"overlong_buffer_length={c.overlong_buffer_length} must be < "
            f"max_response_length={c.max_response_length}; 0 disables it."
        ),
    ),
    CrossRule(
        "a reference model may be loaded when a term needs one",
        lambda c: c.needs_reference_model and c.reference_model is None,
        lambda c: (
            f"this config needs a live reference model ({', '.join(c.reference_model_users())}), "
            "but reference_model=None forbids loading one; set reference_model='initial' "
            "(or a model path), or drop the term that needs it."
        ),
    ),
    CrossRule(
        "validation needs a validation split",
        lambda c: bool(c.val_interval) and c.val_env_config is None,
        lambda c: (
            f"val_interval={c.val_interval} but no validation split: set "
            ".held_out(val_env_config={'data': 'sql_synth/test'}) (or val_interval=0)."
        ),
    ),
    CrossRule(
        "mini-batches of whole groups",
        lambda c: c.minibatch_size is not None
        and not (c.minibatch_size <= c.train_rows_per_step and c.minibatch_size % c.group_size == 0),
        lambda c: (
            f"minibatch_size={c.minibatch_size} must be a multiple of group_size="
            f"{c.group_size} (groups stay whole) and <= prompts_per_step * group_size = "
            f"{c.train_rows_per_step} (it counts exploration rows over all learners); or None for one "
            "optimizer step per epoch."
        ),
    ),
)

#: DPH-RL's rules across fields (see ``DPHConfig.dph``).
DPH_CROSS_RULES = (
    CrossRule(
        "an exploration term is weighed by the D_exp size",
        lambda c: c.has_exploration_term and c.resolved_exp_path is None,
        lambda c: (
            f"divergence={c.divergence!r} needs the D_exp file to weigh the exploration term by "
            "β₁ = η·|D_pef|/|D_exp|; set .dph(exp_path=...) or .dph(presample={'out_dir': ...})."
        ),
    ),
    CrossRule(
        "a source of D_pef rows (the files themselves are checked by presample.prepare_pef)",
        lambda c: c.pef_path is None and not c.presample.out_dir,
        lambda c: (
            "no D_pef file: set .dph(presample={'out_dir': ...}) (pre-sampling runs there when its files are "
            "missing) or .dph(pef_path=...) to an existing d_pef.parquet."
        ),
    ),
)
