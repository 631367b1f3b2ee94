"""DPH-RL: Diversity-Preserving Hybrid RL (paper: "The Choice of Divergence", §4).

GRPO's policy-gradient loss on the exploration prompts D_exp, plus η times an f-divergence
between π_θ and the initial policy π_ref on the near-perfect prompts D_pef. The D_pef term
uses reference responses and their log-probs stored by the pre-sampling stage
(``rllib_dph.presample``) and mixed into each update by the offline-data connector
(``rllib_dph.connectors.AddPefRows``), so DPH-F, DPH-JS and α-divergence load no reference
model. Only the JS "divergence definition" (Appendix F, ``divergence="js_definition"``) needs one.
"""

from __future__ import annotations

import os
from typing import Optional, Type, Union

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.utils.annotations import override

from rllib_dph.algorithms.grpo.grpo import GRPO, GRPOConfig
from rllib_dph.algorithms.rules import DPH_CROSS_RULES, DPH_NUMBER_RULES, GRPO_NUMBER_RULES, ChoiceRule
from rllib_dph.losses import F_DIVERGENCES, PEF_NORMALIZATIONS, FDivergenceSpec
from rllib_dph.presample import EXP_FILE, PEF_FILE, PresampleConfig, prepare_pef, read_metadata

#: Fields whose value names an entry of a registry (``DPHConfig.validate``).
DPH_CHOICE_RULES = (
    ChoiceRule("divergence", F_DIVERGENCES),
    ChoiceRule("pef_loss_normalization", PEF_NORMALIZATIONS),
)


class DPHConfig(GRPOConfig):
    """Configuration of :class:`DPH`.

    Example:
        .. code-block:: python

            config = (
                DPHConfig()
                .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
                .llm(model_name="tiny-sql-math")
                .dph(divergence="js", pef_coeff=0.05, presample_dir="presample/sql_tiny")
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
        self.presample_dir = None
        self.presample_k = 8
        self.presample_min_correct = 7
        self.pef_samples = "refine"
        self.pef_full_data = False

    @override(AlgorithmConfig)
    def get_default_learner_class(self) -> Union[Type, str]:
        from rllib_dph.algorithms.dph.dph_torch_learner import DPHTorchLearner

        return DPHTorchLearner

    def dph(
        self,
        *,
        divergence: Optional[str] = NotProvided,
        pef_coeff: Optional[float] = NotProvided,
        pef_loss_normalization: Optional[str] = NotProvided,
        alpha: Optional[float] = NotProvided,
        pef_path: Optional[str] = NotProvided,
        exp_path: Optional[str] = NotProvided,
        pef_ratio: Optional[float] = NotProvided,
        presample_dir: Optional[str] = NotProvided,
        presample_k: Optional[int] = NotProvided,
        presample_min_correct: Optional[int] = NotProvided,
        pef_samples: Optional[Union[str, int]] = NotProvided,
        pef_full_data: Optional[bool] = NotProvided,
    ) -> "DPHConfig":
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
                their stored log-probs). Defaults to ``<presample_dir>/d_pef.parquet``.
            exp_path: The ``d_exp.parquet`` whose prompts the env runners sample (overrides
                ``env_config["data"]``). Defaults to ``<presample_dir>/d_exp.parquet``.
            pef_ratio: Exploration rows per D_pef row in every update (paper: 2048 : 256 = 8).
            presample_dir: Directory of the pre-sampling stage. When its files are missing,
                the algorithm runs pre-sampling there first (with the policy model, the env's
                ``env_config`` data, ``presample_k`` and ``presample_min_correct``).
            presample_k: Samples per prompt for an automatic pre-sampling run (default 8).
            presample_min_correct: m of k correct for D_pef (default 7; paper's advice: 8 of 8).
            pef_samples: Trajectories kept per D_pef prompt: ``"all"`` (the paper's "8 of 8"
                recipe), ``"refine"`` (default) or n (``PresampleConfig.pef_samples``); each is a
                row of its own, counted by ``pef_ratio`` and dealt like any D_pef row.
            pef_full_data: Every prompt in D_exp too (Table 4's "Full Data"; default False).
        """
        self._set_provided(
            divergence=divergence, pef_coeff=pef_coeff, pef_loss_normalization=pef_loss_normalization,
            alpha=alpha, pef_path=pef_path, exp_path=exp_path, pef_ratio=pef_ratio, presample_dir=presample_dir,
            presample_k=presample_k, presample_min_correct=presample_min_correct, pef_samples=pef_samples,
            pef_full_data=pef_full_data,
        )
        return self

    @property
    def resolved_pef_path(self) -> Optional[str]:
        if self.pef_path is not None:
            return self.pef_path
        return os.path.join(self.presample_dir, PEF_FILE) if self.presample_dir else None

    @property
    def resolved_exp_path(self) -> Optional[str]:
        if self.exp_path is not None:
            return self.exp_path
        return os.path.join(self.presample_dir, EXP_FILE) if self.presample_dir else None

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
        """Exploration prompts come from D_exp (and SQL databases from its ``db_root``)."""
        env_config = dict(self.env_config)
        exp = self.resolved_exp_path
        if exp is not None and os.path.exists(exp):
            env_config["data"] = exp
            db_root = read_metadata(exp).get("db_root")
            if db_root is not None:
                env_config.setdefault("db_root", db_root)
        return env_config

    def presample_config(self) -> PresampleConfig:
        """The pre-sampling run that produces ``presample_dir`` for this config."""
        return PresampleConfig(
            model_name=self.model_name,
            env=self.env,
            env_config=dict(self.env_config),
            out_dir=self.presample_dir,
            k=self.presample_k,
            min_correct=self.presample_min_correct,
            pef_samples=self.pef_samples,
            full_data=self.pef_full_data,
            temperature=self.temperature,
            top_p=self.top_p,
            max_response_length=self.max_response_length,
            seed=self.seed or 0,
            engine=self.engine,
            engine_kwargs=dict(self.engine_kwargs),
            dtype=self.dtype,
            num_gpus_per_env_runner=self.num_gpus_per_env_runner,
        )

    @property
    def needs_presampling(self) -> bool:
        """True when ``presample_dir`` is set and its D_pef file does not exist yet (a look at
        the disk; :func:`~rllib_dph.presample.prepare_pef` decides, also about stale files)."""
        return bool(self.presample_dir) and not os.path.exists(self.resolved_pef_path)

    number_rules = GRPO_NUMBER_RULES + DPH_NUMBER_RULES
    config_rules = GRPOConfig.config_rules + DPH_CHOICE_RULES + DPH_CROSS_RULES


class DPH(GRPO):
    """DPH-RL: GRPO on D_exp plus the f-divergence term on D_pef rows.

    ``setup`` makes the D_pef file ready first (:func:`~rllib_dph.presample.prepare_pef`:
    pre-sampling ``presample_dir`` when it has no files for this run, refusing a D_pef file made
    by another model or with other sampling settings); the learners mix D_pef rows into every update through :class:`~rllib_dph.connectors.AddPefRows`.
    """

    @classmethod
    @override(GRPO)
    def get_default_config(cls) -> DPHConfig:
        return DPHConfig()

    @override(GRPO)
    def setup(self, config) -> None:
        prepare_pef(config)  # pre-samples or reuses presample_dir, refuses a D_pef file made for another run
        super().setup(config)
