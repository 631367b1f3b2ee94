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
from rllib_dph.presample import (
    EXP_FILE,
    PEF_FILE,
    SAMPLING_SETTINGS,
    PresampleConfig,
    presample_once,
    read_identity,
    read_metadata,
)

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
            presample_min_correct: m of k correct for D_pef (default 7).
        """
        self._set_provided(
            divergence=divergence,
            pef_coeff=pef_coeff,
            pef_loss_normalization=pef_loss_normalization,
            alpha=alpha,
            pef_path=pef_path,
            exp_path=exp_path,
            pef_ratio=pef_ratio,
            presample_dir=presample_dir,
            presample_k=presample_k,
            presample_min_correct=presample_min_correct,
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
        """True when ``presample_dir`` is set and its D_pef file does not exist yet."""
        return bool(self.presample_dir) and not os.path.exists(self.resolved_pef_path)

    @property
    def presampling_manages_pef(self) -> bool:
        """True when the D_pef file is ``presample_dir``'s own (no ``pef_path``): ``DPH.setup``
        then (re)makes it for this model, data and sampling settings before checking it."""
        return bool(self.presample_dir) and self.pef_path is None

    number_rules = GRPO_NUMBER_RULES + DPH_NUMBER_RULES
    config_rules = GRPOConfig.config_rules + DPH_CHOICE_RULES + DPH_CROSS_RULES

    @override(GRPOConfig)
    def validate(self) -> None:
        """GRPO's rule tables with DPH's added, then the D_pef file; never builds or loads a model.

        The D_pef file's model fingerprint is checked here only when the policy model is at
        hand without building or downloading it; ``DPH.setup`` checks it in every case.
        """
        super().validate()
        self._validate_pef_source()

    def _validate_pef_source(self) -> None:
        """Refuses a missing D_pef file unless pre-sampling will make it, then checks the file."""
        err = self._value_error
        pef = self.resolved_pef_path
        if pef is None:
            err(
                "no D_pef file: set .dph(presample_dir=...) (pre-sampling runs there when its "
                "files are missing) or .dph(pef_path=...) to an existing d_pef.parquet."
            )
        elif self.needs_presampling:
            return  # DPH.setup runs pre-sampling first; the file is checked after that.
        elif not os.path.exists(pef):
            err(f"pef_path={pef!r} does not exist; run `rllib presample` first or fix the path.")
        else:
            fingerprint = self._available_model_fingerprint()
            if self.presampling_manages_pef and not self._presample_dir_is_current(fingerprint):
                return  # DPH.setup pre-samples again for this model and settings, then checks the file.
            self._validate_pef_file(pef, fingerprint=fingerprint)

    def _presample_dir_is_current(self, fingerprint: Optional[str]) -> bool:
        """Whether ``presample_dir`` records this config's sampling settings and (when
        ``fingerprint``, the model's, is known) its model; a stale directory is pre-sampled again
        before training."""
        identity = read_identity(self.presample_dir)
        if identity is None or any(identity.get(name) != getattr(self, name) for name in SAMPLING_SETTINGS):
            return False
        return fingerprint is None or identity.get("model_fingerprint") == fingerprint

    def _available_model_fingerprint(self) -> Optional[str]:
        """The policy model's fingerprint if it is on disk already (nothing built), else None."""
        from rllib_dph.models.hub import model_fingerprint

        try:
            return model_fingerprint(self.model_name)
        except (OSError, ValueError):  # not built, not cached: DPH.setup checks after resolving
            return None

    def _validate_pef_file(self, path: str, *, fingerprint: Optional[str]) -> None:
        """Refuses an empty D_pef file, one sampled with other settings, or (when
        ``fingerprint`` is given) one made by another model."""
        import pyarrow.parquet as pq

        err = self._value_error
        if pq.read_metadata(path).num_rows == 0:
            err(
                f"D_pef file {path!r} is empty: no training prompt reached "
                f"{self.presample_min_correct} correct samples; lower presample_min_correct or "
                "use a stronger base model."
            )
        meta = read_metadata(path)
        fix = (
            f"re-run pre-sampling with this config (delete {os.path.dirname(path) or '.'} or run "
            "`rllib presample` with the training settings), or set the config to the file's values"
        )
        for name in SAMPLING_SETTINGS:
            if name not in meta:
                err(f"D_pef file {path!r} does not record its {name} (made by an older rllib_dph); {fix}.")
            if float(meta[name]) != float(getattr(self, name)):
                err(
                    f"D_pef file {path!r} was sampled with {name}={meta[name]}, but this config has "
                    f"{name}={getattr(self, name)}: its stored reference log-probs belong to another "
                    f"distribution; {fix}."
                )
        made_by = meta.get("model_fingerprint")
        if fingerprint is not None and made_by != fingerprint:
            err(
                f"D_pef file {path!r} was made by model {meta.get('model_name')!r} (fingerprint "
                f"{made_by}), but the policy is {self.model_name!r} (fingerprint {fingerprint}); its "
                "stored reference log-probs belong to another model or tokenizer. Re-run "
                "pre-sampling with this model."
            )


class DPH(GRPO):
    """DPH-RL: GRPO on D_exp plus the f-divergence term on D_pef rows.

    ``setup`` runs the pre-sampling stage first when ``presample_dir`` has no files yet; the
    learners mix D_pef rows into every update through :class:`~rllib_dph.connectors.AddPefRows`.
    """

    @classmethod
    @override(GRPO)
    def get_default_config(cls) -> DPHConfig:
        return DPHConfig()

    @override(GRPO)
    def setup(self, config) -> None:
        from rllib_dph.models.hub import model_fingerprint, resolve_model

        fingerprint = model_fingerprint(resolve_model(config.model_name))
        if config.presample_dir:  # one pre-sampling per directory, also for parallel trials
            presample_once(config.presample_config(), fingerprint=fingerprint)
        config._validate_pef_file(config.resolved_pef_path, fingerprint=fingerprint)
        super().setup(config)
