"""The ``trust_region`` setting of ``GRPOConfig.training``: one grouped setting, its rules beside it.

The setting is a trust region's name (``"dppo_binary_tv"``) or a dict of the keys of
:class:`TrustRegion` (``{"kind": "ppo", "high": 0.28}``); a dict replaces the whole setting,
and every key it leaves out takes its default. ``low``, ``high`` and ``truncation`` left None
take the registry spec's value (``losses.TRUST_REGIONS[kind]``: ``TrustRegionSpec.delta_low``,
``delta_high``, ``truncation``), so the spec is the one place a default lives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Iterator, Optional

from rllib_dph.algorithms.rules import NumberRule
from rllib_dph.losses.trust_regions import TRUST_REGIONS, Threshold, TrustRegionSpec

#: What the trust region and the importance weight are anchored on (``TrustRegion.anchor``).
ANCHORS = ("behavior", "recompute")
#: The rule of ``truncation`` (None: the spec's C, else ∞).
TRUNCATION_RULE = NumberRule(
    "trust_region['truncation']", low=0, low_open=True, optional=True, allow_inf=True,
    fix="None for the trust region's own C (∞ for the masks), or a C > 0 such as 5",
)


@dataclass(frozen=True)
class TrustRegion:
    """The trust region or off-policy correction of the policy-gradient term (DPPO Eq. 23).

    Attributes:
        kind: A name of ``losses.TRUST_REGIONS`` (table in ``docs/trust_regions.md``). Default
            ``"ppo"``.
        low: The rule's lower threshold: PPO's ε_low, DPPO's δ for negative advantages, IPO's
            ε for π < μ, ICEPOP's ratio bound a, OPSM's δ. None (default): the spec's
            (``TrustRegionSpec.delta_low``: 0.2 PPO, 0.15 TV, 0.05 KL, 0.3 IPO, 0.5 ICEPOP,
            1e-4 OPSM). Must stay None for a rule without it (``tis``, ``cispo``, ``none``).
        high: The upper threshold: PPO's ε_high (DAPO clip-higher: 0.28), DPPO's δ for positive
            advantages, IPO's ε for π > μ, ICEPOP's b. None (default): the spec's (0.2 PPO,
            0.15 TV, 0.05 KL, 0.3 IPO, 5.0 ICEPOP); OPSM has none.
        truncation: C of the importance weight min(π_θ/μ, C). None (default): the spec's C
            (``TrustRegionSpec.truncation``: 2 for ``tis``, 3 for ``cispo``), else ∞.
        anchor: ``"behavior"`` (default): the rollout engine's μ, as DPPO prescribes (§5.2,
            Takeaway 2); ``"recompute"``: an ablation that recomputes π_old with the learner's
            weights before the update (it hides the train-inference mismatch).
    """

    kind: str = "ppo"
    low: Optional[float] = None
    high: Optional[float] = None
    truncation: Optional[float] = None
    anchor: str = "behavior"

    @classmethod
    def of(cls, value: Any) -> "TrustRegion":
        """The setting a config holds: a name, a dict of this class's keys, or a ``TrustRegion``.

        Raises:
            ValueError: ``value`` is none of those, or a dict has a key this class lacks.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        keys = [f.name for f in fields(cls)]
        if not isinstance(value, Mapping):
            raise ValueError(f"trust_region={value!r} is invalid: give a name of {list(TRUST_REGIONS)} or a dict "
                             f"with the keys {keys}, e.g. {{'kind': 'ppo', 'high': 0.28}}.")
        unknown = [key for key in value if key not in keys]
        if unknown:
            raise ValueError(f"trust_region={dict(value)!r} has no key {unknown[0]!r}; its keys are {keys} "
                             "(docs/algorithms.md).")
        return cls(**value)

    @property
    def spec(self) -> TrustRegionSpec:
        """The ``losses.TRUST_REGIONS`` entry of ``kind``."""
        return TRUST_REGIONS[self.kind]

    def resolved(self) -> "TrustRegion":
        """This setting with the spec's defaults in place of None: the values the learner uses
        (``low``/``high`` None only for a side the rule has no threshold for)."""
        spec = self.spec
        low = None if spec.delta_low is None else spec.delta_low.resolve(self.low)
        high = None if spec.delta_high is None else spec.delta_high.resolve(self.high)
        truncation = self.truncation if self.truncation is not None else (spec.truncation or math.inf)
        return replace(self, low=low, high=high, truncation=truncation)

    def problems(self, rollout_top_k: int) -> Iterator[str]:
        """What is wrong with the setting: each message states the value, the rule and the fix."""
        if self.kind not in TRUST_REGIONS:
            yield f"trust_region kind={self.kind!r} is not one of {list(TRUST_REGIONS)}; pick one of those."
            return
        if self.anchor not in ANCHORS:
            yield f"trust_region['anchor']={self.anchor!r} is not one of {list(ANCHORS)}; pick one of those."
        spec = self.spec
        for key, threshold in (("low", spec.delta_low), ("high", spec.delta_high)):
            problem = _threshold_problem(key, getattr(self, key), threshold)
            if problem is not None:
                yield f"{problem.rstrip('.')} (trust_region kind {self.kind!r} thresholds the {spec.measure})."
        if not TRUNCATION_RULE.holds(self.truncation):
            yield TRUNCATION_RULE.message(self.truncation)
        elif spec.truncation is not None and self.truncation == math.inf:
            yield (f"trust_region kind {self.kind!r} weights every token by min(π_θ/μ, C), but "
                   f"trust_region['truncation']=inf; set it to {spec.truncation} (its source's C, "
                   "docs/trust_regions.md), leave it None for that, or give another finite C > 0.")
        if spec.needs_topk and rollout_top_k < 1:
            yield (f"trust_region kind {self.kind!r} needs the rollout engine's top-K log-probs, "
                   f"but rollout_top_k={rollout_top_k}; set rollout_top_k (e.g. 20).")


def _threshold_problem(key: str, value: Any, threshold: Optional[Threshold]) -> Optional[str]:
    """The message when ``value`` breaks ``threshold``'s range (None: the rule has no such side)."""
    name = f"trust_region[{key!r}]"
    if threshold is None:
        return None if value is None else f"{name}={value!r} is invalid: this trust region has no such threshold; leave it None"
    rule = NumberRule(name, low=threshold.low, high=threshold.high, low_open=threshold.low_open,
                      high_open=threshold.high_open, optional=True, fix=f"None for the default {threshold.default}")
    return None if rule.holds(value) else rule.message(value)


class TrustRegionRule:
    """``GRPOConfig.trust_region`` as a rule of ``GRPOConfig.training_rules``."""

    def violation(self, config: Any) -> Optional[str]:
        """The first problem of ``config``'s trust region, or None."""
        try:
            setting = TrustRegion.of(config.trust_region)
        except (ValueError, TypeError) as error:
            return str(error)
        return next(setting.problems(config.rollout_top_k), None)
