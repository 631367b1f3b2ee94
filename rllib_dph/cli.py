"""The ``rllib`` command.

Ray removed RLlib's own command line after Ray 2.41; this one keeps its interface:

    rllib train file tuned_examples/grpo/sql_tiny_grpo.py [--stop JSON] [--config JSON]
    rllib train --algo GRPO --env rllib_dph/SQL-v0 --config JSON --stop JSON
    rllib build-model tiny-sql-math
    rllib presample --model tiny-sql-math --env rllib_dph/SQL-v0 --out presample/sql_tiny
    rllib evaluate <checkpoint | model> --env rllib_dph/SQL-v0 --env-config '{"data": "sql_synth/test"}'
    rllib export <checkpoint> <folder>

``train`` checks every setting before Ray starts (``rllib_dph.preflight``), builds missing tiny
models and runs DPH pre-sampling in this process, then runs the experiment through Ray Tune, so
results, checkpoints and TensorBoard files land in the usual Tune output directory
(``--storage-path``, default ``~/ray_results``), one folder per run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import runpy
import sys
import time
from typing import Any, Optional

from rllib_dph.imports import ensure_package_envs, import_user_modules, ray_runtime_env

#: Exit code of a run refused by the preflight checks.
PREFLIGHT_EXIT_CODE = 2


def _algorithms() -> dict[str, Any]:
    """Algorithm names accepted by ``--algo`` → their config classes."""
    from rllib_dph.algorithms import ALGORITHMS

    return ALGORITHMS


def _json(text: Optional[str], flag: str) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"rllib: {flag} is not valid JSON ({e.msg} at char {e.pos}): {text!r}")
    if not isinstance(value, dict):
        raise SystemExit(f"rllib: {flag} must be a JSON object like '{{\"key\": 1}}', got {text!r}")
    return value


def load_tuned_example(path: str) -> tuple[Any, dict]:
    """Runs a tuned-example file and returns its module-level ``config`` and ``stop``."""
    if not os.path.isfile(path):
        raise SystemExit(f"rllib: no such tuned-example file: {path}")
    namespace = runpy.run_path(path, run_name="rllib_tuned_example")
    if "config" not in namespace:
        raise SystemExit(
            f"rllib: {path} defines no module-level `config`; a tuned example must assign its "
            "AlgorithmConfig to `config` (and may define a `stop` dict)."
        )
    return namespace["config"], dict(namespace.get("stop") or {})


def default_experiment_name(config) -> str:
    """``<Algo>_<env>_<YYYY-mm-dd_HH-MM-SS>``: a new folder for every run."""
    return f"{config.algo_class.__name__}_{_slug(str(config.env))}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def run_experiment(
    config,
    stop: dict,
    *,
    storage_path: Optional[str] = None,
    name: Optional[str] = None,
    checkpoint_freq: int = 0,
    checkpoint_at_end: bool = False,
    num_samples: int = 1,
    resume: bool = False,
    verbose: int = 0,
    callbacks: Optional[list] = None,
    user_modules: tuple = (),
):
    """Runs ``config`` through Ray Tune until ``stop``; returns Tune's ``ResultGrid``.

    Args:
        verbose: 0 prints one line per iteration (``rllib_dph.console``); 1-3 are Tune's own
            verbosity levels (status table, config, results).
        callbacks: More Tune callbacks (e.g. ``rllib_dph.tracking.logger_callbacks``).
        user_modules: Modules that every Ray worker imports first (``--import``).
    """
    from ray import tune

    from rllib_dph.console import IterationPrinter

    _start_ray(verbose, user_modules)
    storage_path = os.path.abspath(os.path.expanduser(storage_path or "~/ray_results"))
    name = name or default_experiment_name(config)
    callbacks = [*(callbacks or []), *([IterationPrinter()] if verbose == 0 else [])]
    experiment_dir = os.path.join(storage_path, name)
    if resume and tune.Tuner.can_restore(experiment_dir):
        tuner = tune.Tuner.restore(experiment_dir, trainable=config.algo_class, resume_errored=True)
    else:
        tuner = tune.Tuner(
            config.algo_class,
            param_space=config,
            tune_config=tune.TuneConfig(num_samples=num_samples),
            run_config=tune.RunConfig(
                name=name,
                storage_path=storage_path,
                stop=stop,
                verbose=verbose,
                callbacks=callbacks,
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=checkpoint_freq, checkpoint_at_end=checkpoint_at_end
                ),
            ),
        )
    print(f"rllib: experiment folder {experiment_dir} (tensorboard --logdir {experiment_dir})", flush=True)
    results = tuner.fit()
    _exit_on_failed_trials(results, verbose)
    return results


def _start_ray(verbose: int, user_modules: tuple) -> None:
    """``ray.init`` (quiet unless ``verbose``; every worker imports ``user_modules`` first) and
    the Tune names of the registered envs."""
    import ray

    from rllib_dph.console import quiet_logging

    envs = ensure_package_envs()
    if verbose == 0:
        quiet_logging()
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's legacy reporter prints nothing at verbose=0
    if not ray.is_initialized():
        ray.init(
            include_dashboard=False,
            log_to_driver=verbose > 0,
            logging_level=logging.INFO if verbose else logging.ERROR,
            runtime_env=ray_runtime_env(user_modules),
        )
    envs.register_tune_envs()


def _exit_on_failed_trials(results, verbose: int) -> None:
    """Exits naming the first failed trial's error once: its exception line and traceback file
    (the whole error with ``verbose``)."""
    from rllib_dph.console import error_summary

    failed = [r for r in results if r.error]
    if failed:
        first = failed[0]
        detail = f"{error_summary(first.error)}\n  full traceback: {os.path.join(first.path, 'error.txt')}"
        raise SystemExit(f"rllib: {len(failed)} trial(s) failed; first error: " + (str(first.error) if verbose else detail))


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="config overrides as JSON, e.g. '{\"model_name\": \"Qwen/Qwen2.5-0.5B\", "
        "\"env_config\": {\"data\": \"train.parquet\"}}'",
    )
    parser.add_argument("--stop", help="stop criteria as JSON, e.g. '{\"training_iteration\": 2}'")
    parser.add_argument("--storage-path", help="Tune output directory (default ~/ray_results)")
    parser.add_argument("--name", help="experiment name (default: <algo>_<env>_<date>_<time>, new per run)")
    parser.add_argument("--checkpoint-freq", type=int, default=0, help="checkpoint every N iterations")
    parser.add_argument("--checkpoint-at-end", action="store_true", help="checkpoint when stopping")
    parser.add_argument("--num-samples", type=int, default=1, help="Tune samples of the config")
    parser.add_argument("--resume", action="store_true", help="resume the experiment named by --name")
    parser.add_argument(
        "-v", "--verbose", type=int, nargs="?", const=1, default=0,
        help="0 (default): one line per iteration; 1-3 (--verbose = 1): Tune's own status table",
    )
    parser.add_argument("--wandb-project", help="log to this W&B project (pip install \"rllib_dph[tracking]\")")
    parser.add_argument("--wandb-offline", action="store_true", help="W&B offline mode (sync later)")
    parser.add_argument("--mlflow-tracking-uri", help="log to MLflow: a tracking URI or a local folder (file store)")
    _add_import_flag(parser)


def _add_import_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="import this module first (it may register envs); repeatable",
    )


def _refuse(problems: list) -> None:
    """Prints the preflight problems once, to stderr, and exits with PREFLIGHT_EXIT_CODE."""
    from rllib_dph.preflight import format_problems

    if problems:
        print(format_problems(problems), file=sys.stderr)
        raise SystemExit(PREFLIGHT_EXIT_CODE)


def check_run(config, stop: dict, args, overrides: dict) -> None:
    """Preflight of a run (applies ``overrides`` to ``config``): every problem of the config, stop,
    paths and trackers, printed once; exits with PREFLIGHT_EXIT_CODE on any."""
    from rllib_dph.preflight import Problem, preflight
    from rllib_dph.tracking import tracking_problems

    problems = preflight(config, stop, config_overrides=overrides)
    tracking = tracking_problems(wandb_project=args.wandb_project, mlflow_tracking_uri=args.mlflow_tracking_uri)
    problems += [Problem("tracking", message) for message in tracking]
    if args.resume and not args.name:
        problems.append(Problem("--resume", "needs --name: the experiment folder to continue."))
    _refuse(problems)


def prepare_run(config) -> None:
    """Work that must not happen inside a Tune trial, done here with in-place progress bars.

    Builds a bundled tiny model that is neither shipped nor cached, and runs DPH pre-sampling
    when ``presample_dir`` has no files yet (the trial then finds them).
    """
    from rllib_dph.models.hub import resolve_model
    from rllib_dph.models.tiny import TINY_MODELS
    from rllib_dph.preflight import search_variants, validate_problems

    for name in {config.model_name, getattr(config, "reference_model_name", None)} & set(TINY_MODELS):
        resolve_model(name)
    for variant in search_variants(config):
        if getattr(variant, "needs_presampling", False):
            from rllib_dph.presample import presample_once

            presample_once(variant.presample_config())  # one run per folder, also across commands
            _refuse(validate_problems(variant))


def _run_from_args(config, stop: dict, args) -> None:
    from rllib_dph.tracking import logger_callbacks

    from rllib_dph.console import quiet_logging

    if args.verbose == 0:
        quiet_logging()
    overrides = _json(args.config, "--config")
    stop = {**stop, **_json(args.stop, "--stop")}
    user_modules = import_user_modules(args.imports)
    check_run(config, stop, args, overrides)
    prepare_run(config)
    name = args.name or default_experiment_name(config)
    callbacks = logger_callbacks(
        name,
        wandb_project=args.wandb_project,
        wandb_offline=args.wandb_offline,
        mlflow_tracking_uri=args.mlflow_tracking_uri,
    )
    results = run_experiment(
        config,
        stop,
        storage_path=args.storage_path,
        name=name,
        checkpoint_freq=args.checkpoint_freq,
        checkpoint_at_end=args.checkpoint_at_end,
        num_samples=args.num_samples,
        resume=args.resume,
        verbose=args.verbose,
        callbacks=callbacks,
        user_modules=tuple(user_modules),
    )
    _print_summary(results)


def _print_summary(results) -> None:
    metric = "env_runners/episode_return_mean"
    for result in results:
        print(
            f"trial {result.path}: training_iteration={result.metrics.get('training_iteration')} "
            f"{metric}={result.metrics.get('env_runners', {}).get('episode_return_mean')}"
        )
    if len(results) > 1:
        best = results.get_best_result(metric=metric, mode="max")
        print(f"best trial by {metric}: {best.path}")
        configs = [r.config for r in results]
        varied = {k for k in best.config if len({repr(c.get(k)) for c in configs}) > 1}
        print(f"best trial's swept values: {json.dumps({k: best.config[k] for k in sorted(varied)}, default=str)}")


def run_tuned_example(config, stop: dict, argv: Optional[list[str]] = None) -> None:
    """``python <tuned_example.py> [--stop JSON] ...``: what ``rllib train file`` does."""
    ensure_package_envs()
    parser = argparse.ArgumentParser(description="Run this tuned example through Ray Tune.")
    _add_run_flags(parser)
    _run_from_args(config, stop, parser.parse_args(argv))


def _train(args) -> None:
    if args.target == "file":
        if not args.file:
            raise SystemExit("rllib: `rllib train file` needs the path of a tuned-example file.")
        config, stop = load_tuned_example(args.file)
    else:
        if args.target is not None:
            raise SystemExit(f"rllib: unknown train target {args.target!r}; use `rllib train file <path>`.")
        if not args.algo or not args.env:
            raise SystemExit("rllib: `rllib train` needs --algo and --env (or `rllib train file <path>`).")
        algorithms = _algorithms()
        if args.algo not in algorithms:
            raise SystemExit(f"rllib: --algo {args.algo!r} is not one of {sorted(algorithms)}.")
        config = algorithms[args.algo]().environment(args.env)
        stop = {}
    _run_from_args(config, stop, args)


def _build_model(args) -> None:
    from rllib_dph.models.hub import resolve_model

    path = resolve_model(args.name, build=True, force=args.force)
    print(path)


def _presample(args) -> None:
    from rllib_dph.presample import PresampleConfig, presample

    import_user_modules(args.imports)
    config = PresampleConfig(
        model_name=args.model,
        env=args.env,
        env_config=_json(args.env_config, "--env-config"),
        out_dir=args.out,
        k=args.k,
        min_correct=args.min_correct,
        refine=not args.no_refine,
        temperature=args.temperature,
        top_p=args.top_p,
        max_response_length=args.max_response_length,
        seed=args.seed,
        prompts_per_chunk=args.prompts_per_chunk,
        engine=args.engine,
        engine_kwargs=_json(args.engine_kwargs, "--engine-kwargs"),
        dtype=args.dtype,
    )
    summary = presample(config)
    print(
        f"D_pef: {summary['num_pef']} prompts, D_exp: {summary['num_exp']} prompts "
        f"({summary['num_refinement_failures']} candidates failed refinement); "
        f"pass@1 {summary['pass_at_1']:.3f}, pass@{args.k} {summary['pass_at_k']:.3f}; "
        f"files in {args.out}"
    )


def _slug(text: str) -> str:
    """``text`` as a folder name: runs of characters other than letters, digits, ``_.-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.")[-80:]


def _default_eval_out(policy: str, env: str, env_config: dict) -> str:
    """``eval_results/<policy>__<env>[_<data>]``, slugged (see ``_slug``)."""
    target = env + (f"_{env_config['data']}" if isinstance(env_config.get("data"), str) else "")
    return os.path.join("eval_results", f"{_slug(policy)}__{_slug(target)}")


def _evaluate(args) -> None:
    from rllib_dph.evaluation import (
        EvalResult,
        EvalSettings,
        compare,
        evaluate,
        finite_or_none,
        format_summary,
        plot_pass_at_k,
    )

    import_user_modules(args.imports)
    env_config = _json(args.env_config, "--env-config")
    baseline = EvalResult.from_json(args.baseline) if args.baseline else None  # fail before evaluating
    settings = EvalSettings(
        n=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        ks=args.ks, greedy=not args.no_greedy, seed=args.seed, style_suite=args.style_suite, limit=args.limit,
        batch_prompts=args.batch_prompts, keep_completions=args.keep_completions, progress=True,
    )
    result = evaluate(
        args.policy,
        args.env,
        env_config,
        settings,
        engine=args.engine,
        dtype=args.dtype,
        device=args.device,
        engine_kwargs=_json(args.engine_kwargs, "--engine-kwargs"),
        name=args.name or "",
    )
    out = args.out or _default_eval_out(args.policy, args.env, env_config)
    others = list(args.plot)  # the baseline is drawn too
    if args.baseline and args.baseline not in others:
        others.insert(0, args.baseline)
    written = [
        result.to_json(os.path.join(out, "results.json")),
        result.to_csv(os.path.join(out, "results.csv")),
        plot_pass_at_k([result, *others], os.path.join(out, "pass_at_k.png")),
    ]
    comparisons = {}
    if baseline is not None:
        try:
            comparisons = {k: compare(result, baseline, k) for k in result.ks if k <= baseline.n}
        except ValueError as e:
            raise SystemExit(f"rllib evaluate: wrote {', '.join(map(str, written))}, but --baseline: {e}")
        path = os.path.join(out, "compare.json")
        by_k = {k: finite_or_none(c) for k, c in comparisons.items()}
        with open(path, "w") as f:
            json.dump({"baseline": args.baseline, "by_k": by_k}, f, indent=1)
        written.append(path)
    print(format_summary(result, comparisons))
    print("wrote " + ", ".join(str(p) for p in written))


def _export(args) -> None:
    from rllib_dph.export import export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.folder, dtype=args.dtype)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"rllib export: {e}")
    print(f"wrote a Hugging Face model folder: {out} (AutoModelForCausalLM.from_pretrained / vllm.LLM)")


def _add_export_parser(sub) -> None:
    exp = sub.add_parser("export", help="write a checkpoint's policy as a Hugging Face model folder")
    exp.add_argument("checkpoint", help="Algorithm checkpoint folder (Tune checkpoint_00000N)")
    exp.add_argument("folder", help="output folder (safetensors, config, tokenizer, chat template)")
    exp.add_argument("--dtype", help="weight dtype of the export (default: float32 as trained)")
    exp.set_defaults(func=_export)


def main(argv: Optional[list[str]] = None) -> None:
    ensure_package_envs()
    parser = argparse.ArgumentParser(prog="rllib", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train an algorithm through Ray Tune")
    train.add_argument("target", nargs="?", choices=["file"], help="`file` to run a tuned example")
    train.add_argument("file", nargs="?", help="tuned-example .py file defining `config` [and `stop`]")
    train.add_argument("--algo", help="algorithm name, e.g. GRPO")
    train.add_argument("--env", help="env id, e.g. rllib_dph/SQL-v0")
    _add_run_flags(train)
    train.set_defaults(func=_train)

    build = sub.add_parser(
        "build-model", help="find the shipped build of a bundled tiny model, or build it into the cache (offline)"
    )
    build.add_argument("name", nargs="?", default="tiny-sql-math")
    build.add_argument("--force", action="store_true", help="rebuild into the cache even if shipped or cached")
    build.set_defaults(func=_build_model)

    pre = sub.add_parser("presample", help="DPH-RL pre-sampling: split prompts into D_pef / D_exp")
    pre.add_argument("--model", default="tiny-sql-math", help="base policy (name, path or HF id)")
    pre.add_argument("--env", default="rllib_dph/SQL-v0", help="env id")
    pre.add_argument("--env-config", help='env kwargs as JSON, e.g. \'{"data": "sql_synth/train"}\'')
    pre.add_argument("--out", required=True, help="output directory (resumes if it has parts)")
    pre.add_argument("--k", type=int, default=8, help="samples per prompt (default 8)")
    pre.add_argument("--min-correct", type=int, default=7, help="m of k correct for D_pef (default 7)")
    pre.add_argument("--no-refine", action="store_true", help="skip the refinement sample")
    pre.add_argument("--temperature", type=float, default=1.0)
    pre.add_argument("--top-p", type=float, default=1.0)
    pre.add_argument("--max-response-length", type=int, default=128)
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--prompts-per-chunk", type=int, default=64)
    pre.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    pre.add_argument("--engine-kwargs", help="engine kwargs as JSON")
    pre.add_argument("--dtype", default="float32")
    _add_import_flag(pre)
    pre.set_defaults(func=_presample)

    ev = sub.add_parser(
        "evaluate",
        help="pass@k / greedy / maj@k / styles of a checkpoint or model on an env split",
        description="Evaluate a policy: n samples and one greedy completion per prompt. Writes "
        "results.json, results.csv (one row per prompt) and pass_at_k.png into --out.",
    )
    ev.add_argument("policy", help="Algorithm checkpoint folder, bundled model name, model folder or HF id")
    ev.add_argument("--env", default="rllib_dph/SQL-v0", help="env id (default rllib_dph/SQL-v0)")
    ev.add_argument("--env-config", help='env kwargs as JSON, e.g. \'{"data": "sql_synth/test"}\'')
    ev.add_argument("--n", type=int, default=16, help="samples per prompt (default 16)")
    ev.add_argument("--temperature", type=float, default=1.0)
    ev.add_argument("--top-p", type=float, default=1.0)
    ev.add_argument("--max-new-tokens", type=int, default=128)
    ev.add_argument("--ks", type=int, nargs="+", help="k of pass@k / maj@k (default 1, 2, 4, ... <= n)")
    ev.add_argument("--no-greedy", action="store_true", help="skip the greedy completion")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--style-suite", help="suite whose style function names the styles (default: the task's)")
    ev.add_argument("--limit", type=int, help="evaluate only the first N prompts")
    ev.add_argument("--batch-prompts", type=int, default=16, help="prompts per generate call (default 16)")
    ev.add_argument("--keep-completions", action="store_true", help="store completion texts in the JSON")
    ev.add_argument("--baseline", help="results.json of the base model: keep / exploration rates, and plotted")
    ev.add_argument("--plot", nargs="+", default=[], help="more results.json files to draw on the same plot")
    ev.add_argument("--out", help="output folder (default eval_results/<policy>__<env>_<data>)")
    ev.add_argument("--name", help="label of this run in plots (default: the policy argument)")
    ev.add_argument("--engine", default="hf", help="rollout engine (default hf)")
    ev.add_argument("--engine-kwargs", help="engine kwargs as JSON")
    ev.add_argument("--dtype", help="weight dtype (default: the checkpoint's)")
    ev.add_argument("--device", default="cpu", help="device of the engine (default cpu)")
    _add_import_flag(ev)
    ev.set_defaults(func=_evaluate)

    _add_export_parser(sub)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
