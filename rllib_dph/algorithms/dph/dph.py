"""DPH-RL: Diversity-Preserving Hybrid RL (paper: "The Choice of Divergence", §4).

GRPO's policy-gradient loss on the exploration prompts D_exp, plus η times an f-divergence
between π_θ and the initial policy π_ref on the near-perfect prompts D_pef. The D_pef term
uses reference responses and their log-probs stored by the pre-sampling stage
(``rllib_dph.algorithms.dph.presample``) and mixed into each update by the offline-data connector
(``rllib_dph.algorithms.dph.pef_rows.AddPefRows``), so DPH-F, DPH-JS and α-divergence load no reference
model. Only the JS "divergence definition" (Appendix F, ``divergence="js_definition"``) needs one.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Type, Union

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.utils.annotations import override

from rllib_dph.algorithms.grpo.grpo import GRPO, GRPOConfig
from rllib_dph.algorithms.rules import ChoiceRule, CrossRule, NumberRule
from rllib_dph.algorithms.setters import setter
from rllib_dph.losses.divergences import F_DIVERGENCES, PEF_NORMALIZATIONS, FDivergenceSpec
from rllib_dph.algorithms.dph.presample import EXP_FILE, PEF_FILE, TRAINING_FIELDS, PresampleConfig, prepare_pef
from rllib_dph.algorithms.dph.presample import read_metadata, read_presampled

def _merged_presample(current: PresampleConfig, value: Union[PresampleConfig, dict]) -> PresampleConfig:
    """``value`` itself, or ``current`` with the keys of the dict ``value`` set."""
    if isinstance(value, PresampleConfig):
        return value
    keys = [f.name for f in dataclasses.fields(PresampleConfig) if f.name not in TRAINING_FIELDS]
    unknown = [key for key in value if key not in keys] if isinstance(value, dict) else None
    if unknown is None or unknown:
        raise ValueError(f"presample={value!r} is invalid: give a PresampleConfig or a dict of its keys {keys}"
                         + (f"; {unknown[0]!r} is none of them" if unknown else "") + " (docs/algorithms.md).")
    return dataclasses.replace(current, **value)


class PresampleRule:
    """The embedded ``presample`` (its own rules, ``PresampleConfig.problem``) and its fields
    that training owns, as a rule of ``DPHConfig.dph_rules``."""

    def violation(self, config: Any) -> Optional[str]:
        presample, defaults = config.presample, PresampleConfig()
        if not isinstance(presample, PresampleConfig):
            return f"presample={presample!r} is invalid: it must be a PresampleConfig; set it with .dph(presample=...)."
        problem = presample.problem()
        if problem is not None:
            return f"presample: {problem}"
        owned = [name for name in TRAINING_FIELDS if getattr(presample, name) != getattr(defaults, name)]
        if owned:
            return (f"presample.{owned[0]}={getattr(presample, owned[0])!r}: pre-sampling takes {owned[0]} from the "
                    "training config (its log-probs must be training's μ); set it there, leave it at its default here.")
        return None


class DPHConfig(GRPOConfig):
    """Configuration of :class:`DPH`.

    Example:
        .. code-block:: python

            config = (
                DPHConfig()
                .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
                .llm(model_name="tiny-sql-math")
                .dph(divergence="js", pef_coeff=0.05, presample={"out_dir": "presample/sql_tiny"})
            )
    """

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or DPH)
        self.divergence = "js"
        self.pef_coeff = 0.05
        self.pef_loss_normalization = "original"
        self.alpha = 0.5
        self.pef_path = None
        self.exp_path = None
        self.pef_ratio = 8.0
        self.presample = PresampleConfig(out_dir=None)

    @override(AlgorithmConfig)
    def get_default_learner_class(self) -> Union[Type, str]:
        from rllib_dph.algorithms.dph.dph_torch_learner import DPHTorchLearner

        return DPHTorchLearner

    #: The rules of ``dph()``'s fields (``validate``).
    dph_rules = (
        NumberRule("pef_coeff", low=0, fix="η of the paper, 0.01-0.2"),
        NumberRule("alpha", low=0, high=1, low_open=True, high_open=True, fix="α of the α-divergence, e.g. 0.5"),
        NumberRule("pef_ratio", low=0, low_open=True, fix="exploration rows per D_pef row, paper: 8"),
        ChoiceRule("divergence", F_DIVERGENCES),
        ChoiceRule("pef_loss_normalization", PEF_NORMALIZATIONS),
        PresampleRule(),
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

    @setter
    def dph(self, given: dict) -> None:
        """Sets the DPH-RL specific configuration.

        Args:
            divergence: The divergence to π_ref (``losses.F_DIVERGENCES``): ``"forward_kl"``
                (DPH-F), ``"js"`` (DPH-JS; default) or ``"alpha"`` (α-divergence), an
                f-divergence term on D_pef rows (``losses.f_divergence``); or
                ``"js_definition"``, the JS "divergence definition" (Appendix F): D_pef term
                KL(π_ref‖M) and exploration term β₁·KL(π_θ‖M), M = (π_ref + π_θ)/2 per token,
                β₁ = η·|D_pef|/|D_exp|. It needs a live reference model for exploration rows and
                the D_exp file.
            pef_coeff: η, weight of the D_pef term (paper Eq. 7; 0.01–0.2, default 0.05).
            pef_loss_normalization: What η multiplies (``losses.pef_loss_weight``):
                ``"original"`` (default): as in the original DPH-RL code, whose micro-batch
                averaging weighs the D_pef term by its share of the rows, so the term's weight
                relative to the policy loss is η·N_pef/N_exp (≈ η/8 at the paper's 8:1 mix), and
                DPH-JS's generator counts twice (the code's ``js_low_var`` is 2 × JS) — the
                paper's Table 6 η values were tuned with that code and mean the same here;
                ``"token_mean"``: η × the token-mean of Eq. 7 read literally (8× stronger at 8:1).
            alpha: α of the α-divergence, 0 < α < 1 (default 0.5).
            pef_path: The ``d_pef.parquet`` of the pre-sampling stage (reference responses with
                their stored log-probs). Defaults to ``<presample.out_dir>/d_pef.parquet``.
            exp_path: The ``d_exp.parquet`` whose prompts the env runners sample (overrides
                ``env_config["data"]``). Defaults to ``<presample.out_dir>/d_exp.parquet``.
            pef_ratio: Exploration rows per D_pef row in every update (paper: 2048 : 256 = 8).
            presample: The pre-sampling stage, one embedded ``presample.PresampleConfig``:
                ``out_dir`` (None: no automatic pre-sampling; its files missing, the algorithm
                pre-samples there first), ``k`` (8), ``min_correct`` (7; paper's advice: 8 of 8),
                ``pef_samples`` (``"all"``: the "8 of 8" recipe, ``"refine"`` (default) or n; each
                trajectory a D_pef row, counted by ``pef_ratio``), ``full_data`` (Table 4) and
                ``prompts_per_chunk``. Model, env, sampling and engine are training's
                (``presample_config``). A ``PresampleConfig`` replaces it; a dict sets only its
                keys (``{"min_correct": 8}``, also in ``--config``).
        """
        if "presample" in given:
            given["presample"] = _merged_presample(self.presample, given["presample"])

    @override(GRPOConfig)
    def update_from_dict(self, config_dict: dict) -> "DPHConfig":
        """RLlib's, with ``presample`` going through :meth:`dph` (a dict sets only its keys)."""
        config_dict = dict(config_dict)
        if "presample" in config_dict:
            self.dph(presample=config_dict.pop("presample"))
        return super().update_from_dict(config_dict)

    @property
    def resolved_pef_path(self) -> Optional[str]:
        if self.pef_path is not None:
            return self.pef_path
        return os.path.join(self.presample.out_dir, PEF_FILE) if self.presample.out_dir else None

    @property
    def resolved_exp_path(self) -> Optional[str]:
        if self.exp_path is not None:
            return self.exp_path
        return os.path.join(self.presample.out_dir, EXP_FILE) if self.presample.out_dir else None

    @property
    def divergence_spec(self) -> FDivergenceSpec:
        """The ``losses.F_DIVERGENCES`` entry of ``divergence``."""
        return F_DIVERGENCES[self.divergence]

    @property
    def has_exploration_term(self) -> bool:
        """Whether ``divergence`` adds a term on exploration rows (``FDivergenceSpec.exploration_term``),
        which needs a live reference model and the D_exp file; False for an unknown name."""
        spec = F_DIVERGENCES.get(self.divergence)  # an unknown name is refused by validate()
        return spec is not None and spec.exploration_term is not None

    @override(GRPOConfig)
    def reference_model_users(self) -> list[str]:
        """GRPO's, plus a divergence with an exploration term (its log π_ref is computed live)."""
        users = super().reference_model_users()
        return users + [f"divergence={self.divergence!r}"] if self.has_exploration_term else users

    @property
    def sampling_env_config(self) -> dict:
        """Exploration prompts come from D_exp (and SQL databases from its ``db_root``).

        Raises:
            PefFileError: the D_exp file is missing or not the bytes written
                (``presample.read_presampled``): the env runners (a restarted one too) never
                fall back to the whole split, D_pef prompts included. Checks before pre-sampling
                read ``cli.memory.planned_env_config``.
        """
        env_config = dict(self.env_config)
        exp = self.resolved_exp_path
        if exp is not None:
            read_presampled(exp)
            env_config["data"] = exp
            db_root = read_metadata(exp).get("db_root")
            if db_root is not None:
                env_config.setdefault("db_root", db_root)
        return env_config

    def presample_config(self) -> PresampleConfig:
        """The pre-sampling run that produces ``presample.out_dir`` for this config: the embedded
        stage with training's model, env, sampling and engine settings (``TRAINING_FIELDS``); its
        sampling is :meth:`sampling_params` with ``n=1`` (the stage draws ``presample.k``) and no top-K."""
        return dataclasses.replace(
            self.presample,
            model_name=self.model_name,
            env=self.env,
            env_config=dict(self.env_config),
            sampling=self.sampling_params(n=1, top_k_logprobs=0),
            engine=self.engine,
            engine_kwargs=dict(self.engine_kwargs),
            dtype=self.dtype,
            num_gpus_per_env_runner=self.num_gpus_per_env_runner,
        )

    @property
    def needs_presampling(self) -> bool:
        """True when ``presample.out_dir`` is set and its D_pef file does not exist yet (a look at
        the disk; :func:`~rllib_dph.algorithms.dph.presample.prepare_pef` decides, also about stale files)."""
        return bool(self.presample.out_dir) and not os.path.exists(self.resolved_pef_path)

    rules = GRPOConfig.rules + dph_rules


class DPH(GRPO):
    """DPH-RL: GRPO on D_exp plus the f-divergence term on D_pef rows.

    ``setup`` makes the D_pef file ready first (:func:`~rllib_dph.algorithms.dph.presample.prepare_pef`:
    pre-sampling ``presample.out_dir`` when it has no files for this run, refusing a D_pef file made
    by another model or with other sampling settings); the learners mix D_pef rows into every update through :class:`~rllib_dph.algorithms.dph.pef_rows.AddPefRows`.
    """

    @classmethod
    @override(GRPO)
    def get_default_config(cls) -> DPHConfig:
        return DPHConfig()

    @override(GRPO)
    def setup(self, config) -> None:
        from rllib_dph.models.build.prepare import prepare_models

        prepare_models((config.model_name, config.reference_model_name))  # as GRPO.setup, before pre-sampling
        prepare_pef(config)  # pre-samples or reuses presample.out_dir, refuses a D_pef file made for another run
        super().setup(config)
