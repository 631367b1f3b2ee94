"""Checks a run's settings before Ray starts, so that bad input fails in seconds, not minutes.

``rllib train`` (and every tuned example run as a script) calls :func:`preflight` after the
``--config`` / ``--stop`` overrides are applied and before ``ray.init``. It collects every
problem it finds, each once, naming what was wrong and where:

- ``--config`` keys that are not fields of the algorithm's config, and ``--stop`` keys that are
  not result keys (both with a "did you mean"; RLlib and Tune would ignore them silently);
- the env id (registered with Gymnasium or Tune?) and its ``env_config``: the env is built once
  in this process, which checks the data file, its columns and ``db_root`` with the env's own
  error messages;
- ``model_name`` / the reference model: a bundled name (built, or buildable here), a ``save_pretrained`` folder or a
  Hugging Face id that is in the local HF cache (or reachable);
- every numeric and cross-field rule of the config, by calling ``config.validate()``;
- memory (:func:`memory_problems`, once the rest is right): the estimated peak of every process
  (``rllib_dph.cli.memory``) against this machine's available RAM and its GPUs' free memory. A run
  that will not fit is refused with the estimate, the budget and the cheapest fixes (unless
  ``--force``); one that fits prints its estimate in one line.

``rllib evaluate`` checks its policy the same way (:func:`policy_problem`): a checkpoint, a
model folder, a bundled name or a cached Hugging Face id, refused in one line before any loading.

Relative paths (``model_name``, ``data``, ``db_root``, ``presample.out_dir``, ``pef_path``,
``exp_path``) are first made absolute against the folder the command was started from
(:func:`resolve_paths`), because a Tune trial runs in a folder of its own.
"""

from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from rllib_dph.algorithms.field_names import close_match, field_suggestion

#: Result keys Tune adds to every result (valid ``--stop`` keys next to the algorithm's metrics).
TUNE_RESULT_KEYS = (
    "training_iteration",
    "time_total_s",
    "time_this_iter_s",
    "timesteps_total",
    "episodes_total",
    "iterations_since_restore",
    "time_since_restore",
    "timestamp",
    "done",
)
#: Top-level groups of RLlib results: ``--stop`` keys may name any metric below them.
RESULT_GROUPS = ("env_runners", "learners", "timers", "evaluation", "step_times", "fault_tolerance")
#: Top-level scalar results of RLlib and of GRPO / DPH.
ALGORITHM_RESULT_KEYS = (
    "num_env_steps_sampled_lifetime",
    "num_env_steps_trained_lifetime",
    "num_episodes_lifetime",
    "num_training_step_calls_per_iteration",
    "dynamic_sampling_rounds",
    "dynamic_sampling_groups_kept",
    "shaped_reward_mean",
    "advantage_abs_mean",
)
#: ``env_config`` keys that hold input files or folders.
ENV_PATH_KEYS = ("data", "db_root")
#: Suffixes that mark a ``data`` value as a file even when it does not exist.
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
#: Config fields that hold output or input folders / files whatever their value looks like.
CONFIG_PATH_FIELDS = ("pef_path", "exp_path")
#: Environment variables that put Hugging Face libraries offline.
HF_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
#: Seconds to wait for the Hugging Face Hub when a model id is not in the local cache.
HUB_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run's settings.

    Args:
        where: What was wrong, e.g. ``"--config key 'group_sise'"`` or ``"env_config['data']"``.
        message: Why, and how to fix it.
    """

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, or ``""``."""
    close = close_match(word, choices)
    return f" (did you mean {close!r}?)" if close else ""


def config_key_problems(config, overrides: Mapping[str, Any], where: str = "--config") -> list[Problem]:
    """Keys of ``overrides`` that are not fields of ``config`` (``update_from_dict`` sets them
    silently), each with the field it most likely means (``field_names``).

    Args:
        config: An ``AlgorithmConfig``.
        overrides: The JSON object given to ``--config``.
        where: How the user gave ``overrides`` (named in the problem).
    """
    problems = []
    for key in overrides:
        translated = config._translate_special_keys(key, warn_deprecated=False)
        if translated in vars(config) or translated in ("multiagent", "callbacks_class"):
            continue
        problems.append(
            Problem(
                f"{where} key {key!r}",
                f"{type(config).__name__} has no such field{field_suggestion(config, key)}; "
                f"the fields are documented in {type(config).__module__}.",
            )
        )
    return problems


def stop_key_problems(stop: Mapping[str, Any], where: str = "--stop") -> list[Problem]:
    """``stop`` entries that are not result keys or not numbers (Tune would never stop on them).

    A key is a Tune result key, a top-level RLlib/GRPO result, or a path below one of the result
    groups (``env_runners/reward_mean``, ``evaluation/pass@8``; also as a nested dict).
    """
    known = TUNE_RESULT_KEYS + ALGORITHM_RESULT_KEYS
    problems = []
    for key, value in stop.items():
        head = key.split("/", 1)[0]
        if key in known or (head in RESULT_GROUPS and ("/" in key or isinstance(value, Mapping))):
            if not isinstance(value, (int, float, Mapping)) or isinstance(value, bool):
                problems.append(Problem(f"{where} key {key!r}", f"the value {value!r} is not a number."))
            continue
        problems.append(
            Problem(
                f"{where} key {key!r}",
                f"not a result key{did_you_mean(key, known + RESULT_GROUPS)}; use one of "
                f"{', '.join(TUNE_RESULT_KEYS[:3])}, a top-level result or a metric path such as "
                "'env_runners/reward_mean'.",
            )
        )
    return problems


def _absolute(value: Any, launch_dir: str, *, always: bool) -> Any:
    """``value`` made absolute against ``launch_dir`` when it is a relative path.

    With ``always=False`` only values that exist there or start with ``./``, ``../`` or ``~``
    count as paths (so Hugging Face ids and bundled names stay as they are).
    """
    if not isinstance(value, str) or not value:
        return value
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded
    candidate = os.path.normpath(os.path.join(launch_dir, expanded))
    if always or os.path.exists(candidate) or value.startswith(("./", "../", "~")):
        return candidate
    return value


def resolved_env_config(env_config: Optional[Mapping], launch_dir: str) -> Optional[dict]:
    """``env_config`` with relative ``data`` files and ``db_root`` folders made absolute."""
    if not env_config:
        return env_config
    out = dict(env_config)
    for key in ENV_PATH_KEYS:
        if key in out:
            is_file = isinstance(out[key], str) and out[key].endswith(DATA_SUFFIXES)
            out[key] = _absolute(out[key], launch_dir, always=key == "db_root" or is_file)
    return out


def resolve_paths(config, launch_dir: Optional[str] = None) -> None:
    """Makes the config's relative paths absolute against ``launch_dir`` (default: the cwd), in place.

    ``model_name`` and ``reference_model`` change only when they name an existing folder or start
    with ``./``, ``../``, ``~``; ``env_config`` / ``val_env_config`` as in
    :func:`resolved_env_config`; ``presample.out_dir``, ``pef_path``, ``exp_path`` always.
    """
    launch_dir = os.path.abspath(launch_dir or os.getcwd())
    for field in ("model_name", "reference_model"):
        if hasattr(config, field):
            setattr(config, field, _absolute(getattr(config, field), launch_dir, always=False))
    for field in CONFIG_PATH_FIELDS:
        if getattr(config, field, None):
            setattr(config, field, _absolute(getattr(config, field), launch_dir, always=True))
    if getattr(getattr(config, "presample", None), "out_dir", None):  # DPH's embedded PresampleConfig
        config.presample = dataclasses.replace(
            config.presample, out_dir=_absolute(config.presample.out_dir, launch_dir, always=True)
        )
    config.env_config = resolved_env_config(config.env_config, launch_dir)
    if getattr(config, "val_env_config", None):
        config.val_env_config = resolved_env_config(config.val_env_config, launch_dir)


def env_problems(env_id: Any, env_config: Mapping, where: str = "env") -> list[Problem]:
    """Whether ``env_id`` is registered and builds with ``env_config`` (data, columns, db_root).

    The env is built once here, so its own loader reports a missing file, a missing column or
    a missing database folder before any trial starts.
    """
    import gymnasium as gym

    from rllib_dph.envs import make_env  # importing rllib_dph.envs registers the bundled envs
    if not isinstance(env_id, str):
        return []  # an env class or creator: nothing to look up
    from ray.tune.registry import ENV_CREATOR, _global_registry

    if env_id not in gym.registry and not _global_registry.contains(ENV_CREATOR, env_id):
        hint = did_you_mean(env_id, gym.registry)
        return [
            Problem(
                f"{where} {env_id!r}",
                f"not a registered env id{hint}. Envs of your own module are registered when it "
                "is imported: pass `--import yourmodule`.",
            )
        ]
    db_root = (env_config or {}).get("db_root")
    if isinstance(db_root, str) and not os.path.isdir(db_root):
        return [Problem(f"{where} {env_id!r}: env_config['db_root']", f"no such folder: {db_root}.")]
    try:
        env = make_env(env_id, dict(env_config or {}))
    except Exception as e:  # noqa: BLE001 - any failure of the user's env is reported, once
        return [Problem(f"{where} {env_id!r} with env_config {dict(env_config or {})}", f"{type(e).__name__}: {e}")]
    env.close()
    return []


def _hub_problem(ref, where: str) -> Optional[Problem]:
    """A problem when the Hugging Face id of ``ref`` is neither in the local HF cache nor reachable."""
    from huggingface_hub import HfApi

    from rllib_dph.models.hub import ModelNotFoundError

    try:
        ref.folder()
        return None
    except ModelNotFoundError as e:
        missing = e
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in HF_OFFLINE_VARS):
        return Problem(where, f"{missing.reason} and HF is offline; {missing.fix}.")
    try:
        HfApi().model_info(ref.location, timeout=HUB_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - unreachable hub, unknown repo or invalid id
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return Problem(
            where, f"not a bundled model, not a local folder, {missing.reason}, and the Hub did not "
            f"answer ({reason}); {missing.fix}.",
        )
    return None


def model_problem(model: Optional[str], where: str = "model_name") -> Optional[Problem]:
    """Whether ``model`` names something loadable: bundled name, model folder or cached HF id.

    The name is resolved by ``models.hub.locate_model``, whose typed errors are formatted here.
    """
    from rllib_dph.models.catalog import missing_for_build
    from rllib_dph.models.hub import ModelNotFoundError, locate_model

    if model is None:
        return None
    where = f"{where} {model!r}"
    try:
        ref = locate_model(model)
    except ModelNotFoundError as e:
        if e.kind == "bundled":  # built by the run's preparation step, when it can be here
            missing = missing_for_build(model)
            return None if missing is None else Problem(where, missing)
        path = os.path.expanduser(model)
        parent = os.path.dirname(path) or "."
        hint = did_you_mean(os.path.basename(path), os.listdir(parent)) if os.path.isdir(parent) else ""
        return Problem(where, f"{e.reason}{hint}; {e.fix}.")
    if ref.kind == "folder" and not os.path.isfile(os.path.join(ref.location, "config.json")):
        return Problem(where, "the folder has no config.json; give a folder written by save_pretrained.")
    return _hub_problem(ref, where) if ref.kind == "hub" else None


#: What a policy to evaluate can be (named in :func:`policy_problem`'s messages).
POLICY_KINDS = (
    "an Algorithm checkpoint folder (a trial's checkpoint_00000N, holding rllib_checkpoint.json), a model "
    "folder written by save_pretrained (holding config.json), a bundled model name or a Hugging Face id in "
    "the local cache"
)


def policy_problem(policy: str) -> Optional[str]:
    """Why ``policy`` cannot be loaded, in one line naming it and what was expected; None when
    it can: an Algorithm checkpoint folder, a model folder, a bundled model name (built by the
    preparation step) or a Hugging Face id in the local cache (or reachable). Checked before any loading, so
    a wrong path fails in one line rather than in Hugging Face's traceback of a hub lookup."""
    from rllib_dph.evaluation.runner import find_module_checkpoint
    from rllib_dph.models.catalog import BUNDLED_MODELS
    from rllib_dph.models.hub import is_local_path

    path = Path(policy).expanduser().absolute()
    if path.is_dir():
        try:
            if find_module_checkpoint(path) is not None or (path / "config.json").is_file():
                return None
        except ValueError as e:  # a trial folder or an incomplete checkpoint
            return str(e)
        nested = sorted(path.glob("*/checkpoint_*"))
        example = f" (e.g. {nested[-1]})" if nested else ""
        return f"{path} holds neither rllib_checkpoint.json nor config.json; expected {POLICY_KINDS}{example}."
    if path.exists():
        return f"{path} is a file; expected {POLICY_KINDS}."
    if policy in BUNDLED_MODELS:
        return None
    nearby = did_you_mean(path.name, os.listdir(path.parent)) if path.parent.is_dir() else ""
    if is_local_path(policy) or policy.count("/") > 1:  # a Hugging Face id is "name" or "namespace/name"
        return f"no such folder: {path}{nearby}; expected {POLICY_KINDS}."
    problem = model_problem(policy, "policy")
    if problem is None:
        return None
    return (f"{policy!r} is no folder here ({path}{nearby}), no bundled model name{did_you_mean(policy, BUNDLED_MODELS)} "
            f"and, as a Hugging Face id, {problem.message.split(';')[0]}; expected {POLICY_KINDS}.")


def validate_problems(config) -> list[Problem]:
    """The first rule ``config.validate()`` finds broken (numeric ranges, cross-field rules)."""
    try:
        config.validate()
    except ValueError as e:
        message = str(e).split("\nTo suppress all validation errors")[0]  # RLlib's generic footer
        return [Problem(f"{type(config).__name__}", message)]
    return []


def search_variants(config) -> list:
    """Concrete copies of a config holding Tune search spaces, to check each variant.

    Every ``tune.grid_search`` field is expanded (all combinations); any other search space
    (``tune.uniform`` & co.) is replaced by one sample. A config without search spaces is
    returned as the only variant.
    """
    import itertools

    from ray.tune.search.sample import Domain

    fields = {k: v for k, v in vars(config).items() if isinstance(v, (dict, Domain))}
    grids = {k: v["grid_search"] for k, v in fields.items() if isinstance(v, dict) and list(v) == ["grid_search"]}
    domains = {k: v.sample() for k, v in fields.items() if isinstance(v, Domain)}
    if not grids and not domains:
        return [config]
    variants = []
    for values in itertools.product(*grids.values()):
        variant = config.copy(copy_frozen=False)
        for key, value in {**dict(zip(grids, values)), **domains}.items():
            setattr(variant, key, value)
        variants.append(variant)
    return variants


def variant_problems(config) -> list[Problem]:
    """Env, model, package and ``validate()`` problems of one concrete config."""
    from rllib_dph.cli.memory import planned_env_config
    from rllib_dph.policy.lora import peft_problem

    env_config = planned_env_config(config)
    problems = env_problems(config.env, env_config)
    if getattr(config, "val_env_config", None):
        problems += env_problems(config.env, {**env_config, **config.val_env_config}, "validation env")
    models = {"model_name": config.model_name, "reference_model": _reference(config)}
    for where, model in models.items():
        problem = model_problem(model, where) if where == "model_name" or model != config.model_name else None
        problems += [problem] if problem else []
    if getattr(config, "lora", None) is not None and peft_problem():
        problems.append(Problem(f"lora={config.lora}", peft_problem()))
    return problems + validate_problems(config)


def preflight(
    config,
    stop: Mapping[str, Any],
    *,
    config_overrides: Optional[Mapping[str, Any]] = None,
    launch_dir: Optional[str] = None,
) -> list[Problem]:
    """Applies ``config_overrides`` and resolves relative paths in ``config`` (both in place);
    returns every problem found, once.

    Args:
        config: The ``AlgorithmConfig`` to run (may hold Tune search spaces, see
            :func:`search_variants`).
        stop: Tune stop criteria.
        config_overrides: The ``--config`` JSON: its keys are checked, then it is applied.
        launch_dir: Folder relative paths are resolved against (default: the cwd).

    Returns:
        Problems in the order: keys, env, models, config rules; empty when the run may start.
    """
    problems = config_key_problems(config, config_overrides or {})
    config.update_from_dict(dict(config_overrides or {}))
    problems += stop_key_problems(stop)
    resolve_paths(config, launch_dir)
    variants = search_variants(config)
    for variant in variants:
        problems += variant_problems(variant)
    problems += shared_presample_problems(variants)
    return list(dict.fromkeys(problems))


def shared_presample_problems(variants: list) -> list[Problem]:
    """Search variants that would share one pre-sampling folder while they need different files.

    A folder holds the D_pef of one model, data set, seed and set of sampling and selection
    settings (``presample.run_identity``); two trials that share it while they differ in one of
    those take turns setting each other's files aside, and one whose files were replaced after
    its check may train on the other's (docs/algorithms.md). Variants that differ elsewhere (η,
    the learning rate, ...) share a folder safely.

    Returns:
        One problem per folder shared that way, naming the fields that differ and the fix.
    """
    from rllib_dph.algorithms.dph.presample import identity_settings

    def identity(variant) -> dict:
        stage = variant.presample_config()
        return {"model_name": stage.model_name, "env": stage.env, "env_config": stage.env_config,
                **identity_settings(stage)}

    by_folder: dict[str, list[dict]] = {}
    for variant in variants:
        if getattr(getattr(variant, "presample", None), "out_dir", None) and hasattr(variant, "presample_config"):
            by_folder.setdefault(variant.presample.out_dir, []).append(identity(variant))
    problems = []
    for folder, identities in by_folder.items():
        differ = sorted({key for ident in identities for key in ident if ident[key] != identities[0][key]})
        if differ:
            problems.append(Problem(
                "presample.out_dir",
                f"the sweep's trials share {folder} but differ in {', '.join(differ)}, which decide what the folder "
                "holds: running trials would set each other's pre-sampled files aside. Run those values apart, each "
                "with its own folder (e.g. rllib train ... --config '{\"seed\": 1, \"presample\": {\"out_dir\": "
                f"\"{folder}_seed1\"}}}}'), or sweep only fields that pre-sampling does not read (pef_coeff, lr, ...).",
            ))
    return problems


def _reference(config) -> Optional[str]:
    """The reference model the config loads, or None when it needs none."""
    return config.reference_model_name if getattr(config, "needs_reference_model", False) else None


def format_problems(problems: Iterable[Problem]) -> str:
    """One numbered line per problem, with a header line."""
    problems = list(problems)
    lines = [f"rllib: {len(problems)} problem(s) found before starting Ray:"]
    lines += [f"  {i}. {p}" for i, p in enumerate(problems, 1)]
    return "\n".join(lines)


def memory_problems(config, *, force: bool = False, budget=None, out=None) -> list[Problem]:
    """The memory verdict of every variant of ``config`` (``rllib_dph.cli.memory``).

    Prints one line per variant to ``out`` (default stdout): its estimate when it fits, why it
    is not estimated (e.g. the model or its tokenizer is not on this machine yet, or the env has
    no ``tasks`` to read prompts from), or, with ``force``, the refusal as a warning.

    Args:
        config: The (resolved, valid) algorithm config.
        force: Start a run that does not fit (``--force``): no problem is returned.
        budget: A ``memory.Budget`` (default: this machine's, ``memory.device_budget``).

    Returns:
        One problem per variant that does not fit, naming the estimate, the budget and fixes.
    """
    import sys

    from rllib_dph.cli import memory

    out = out or sys.stdout
    problems = []
    for variant in search_variants(config):
        try:
            shape = memory.model_shape(variant.model_name)
            prompt = memory.longest_prompt(variant)
        except Exception as e:  # noqa: BLE001 - the estimate advises; it never stops a run it cannot make
            print(f"rllib: memory not estimated: {type(e).__name__}: {e}", file=out)
            continue
        check = memory.check_config(variant, shape, prompt, budget or memory.device_budget(variant))
        if check.fits:
            print(memory.fit_line(check), file=out)
        elif force:
            print(f"rllib: --force: starting although {memory.refusal_message(check)}", file=out)
        else:
            problems.append(Problem("memory", memory.refusal_message(check)))
    return list(dict.fromkeys(problems))


def resource_problems(config, available: Mapping[str, float]) -> list[Problem]:
    """Variants of ``config`` one trial of which asks Ray for more CPUs or GPUs than ``available``
    (``ray.cluster_resources()``): Tune would keep such a trial pending without an error.

    A trial's request is RLlib's placement group (``Algorithm.default_resource_request``): the
    algorithm's process with its local learner (``num_gpus_per_learner`` when
    ``num_learners=0``), then each remote learner and env runner.

    Returns:
        One problem per variant and resource that does not fit, naming the request, what the
        cluster has and the fields to lower.
    """
    problems = []
    for variant in search_variants(config):
        bundles = variant.algo_class.default_resource_request(variant).bundles
        for resource, fields in (("GPU", "num_gpus_per_learner, num_gpus_per_env_runner"),
                                 ("CPU", "num_cpus_per_learner, num_cpus_per_env_runner, num_cpus_for_main_process")):
            need = [bundle.get(resource, 0.0) for bundle in bundles]
            have = float(available.get(resource, 0.0))
            if sum(need) > have + 1e-9:
                problems.append(Problem(
                    f"{type(variant).__name__} resources",
                    f"one trial asks Ray for {sum(need):g} {resource}s ({' + '.join(f'{n:g}' for n in need)}: the "
                    f"algorithm with its local learner, then {variant.num_learners} remote learner(s) and "
                    f"{variant.num_env_runners} env runner(s)), and the Ray cluster has {have:g}; Tune would keep "
                    f"the trial pending. Lower {fields} or the number of learners / env runners (fractions "
                    "share a device: 0.5 GPU for the local learner and 0.5 for one env runner put both on one "
                    "GPU), or pass --force on a cluster that adds nodes for pending trials.",
                ))
    return list(dict.fromkeys(problems))  # variants that differ elsewhere ask the same
