"""The ``rllib`` command.

Ray removed RLlib's own command line after Ray 2.41; this one keeps its interface:

    rllib train file tuned_examples/grpo/sql_tiny_grpo.py [--stop JSON] [--config JSON]
    rllib train file <same file> --from-checkpoint runs/exp1/<trial>/checkpoint_000000 --stop JSON --name exp2
    rllib train --algo GRPO --env rllib_dph/SQL-v0 --config JSON --stop JSON
    rllib build-model tiny-sql-math
    rllib presample --model tiny-sql-math --env rllib_dph/SQL-v0 --out presample/sql_tiny
    rllib evaluate <checkpoint | model> --env rllib_dph/SQL-v0 --env-config '{"data": "sql_synth/test"}'
    rllib export <checkpoint> <folder> [--adapter-only]

This module only parses arguments; the work happens in the modules it calls. ``train`` runs an
experiment through ``rllib_dph.cli.experiments`` (preflight checks before Ray starts, tiny models and
DPH pre-sampling built in this process, then Ray Tune, one output folder per run under
``--storage-path``, default ``~/ray_results``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional

from rllib_dph.engines import DEFAULT_ENGINE, ENGINES
from rllib_dph.cli.experiments import (
    PREFLIGHT_EXIT_CODE,
    SLUG_LENGTH,
    add_run_flags,
    exit_on_ctrl_c,
    json_flag,
    load_tuned_example,
    run_from_args,
    slug,
)
from rllib_dph.cli.imports import add_import_flag, import_user_modules


def _algorithms() -> dict[str, Any]:
    """Algorithm names accepted by ``--algo`` → their config classes."""
    from rllib_dph.algorithms import ALGORITHMS

    return ALGORITHMS


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
    run_from_args(config, stop, args)


def _build_model(args) -> None:
    """A bundled model: its current build (shipped or cached), else a new one in the model cache
    (also with ``--force``) with the base model's quality check (``evaluation.base_model``) in its
    build record, which is printed with the fingerprint and the folder. Any other name: resolved
    (a folder, or a Hugging Face id) and printed."""
    from rllib_dph.evaluation.base_model import evaluate_base_policy
    from rllib_dph.models.build.prepare import build_report, prepare_model

    print(build_report(prepare_model(args.name, force=args.force, num_threads=args.threads, evaluate=evaluate_base_policy)))


def _presample(args) -> None:
    from rllib_dph.engines.base import SamplingParams
    from rllib_dph.algorithms.dph.presample import PresampleConfig, presample

    from rllib_dph.models.build.prepare import prepare_model

    import_user_modules(args.imports)
    prepare_model(args.model)  # the preparation step: builds a bundled model not built yet, saying so
    config = PresampleConfig(
        model_name=args.model,
        env=args.env,
        env_config=json_flag(args.env_config, "--env-config"),
        out_dir=args.out,
        k=args.k,
        min_correct=args.min_correct,
        pef_samples=args.pef_samples,
        full_data=args.full_data,
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                                seed=args.seed),
        prompts_per_chunk=args.prompts_per_chunk,
        engine=args.engine,
        engine_kwargs=json_flag(args.engine_kwargs, "--engine-kwargs"),
        dtype=args.dtype,
    )
    summary = presample(config)
    print(
        f"D_pef: {summary['num_pef']} prompts ({summary['num_pef_trajectories']} trajectories), "
        f"D_exp: {summary['num_exp']} prompts "
        f"({summary['num_refinement_failures']} candidates failed refinement); "
        f"pass@1 {summary['pass_at_1']:.3f}, pass@{args.k} {summary['pass_at_k']:.3f}; "
        f"files in {args.out}"
    )


def _default_eval_out(policy: str, env: str, env_config: dict) -> str:
    """``eval_results/<policy>__<env>[_<data>]``, slugged (see ``experiments.slug``); of a path
    the policy part keeps the last parts that fit whole (a checkpoint: its trial folder and
    ``checkpoint_00000N``)."""
    parts = [part for part in policy.split("/") if part not in ("", ".", "~")]
    label = parts.pop() if parts else policy
    while parts and len(parts[-1]) + 1 + len(label) <= SLUG_LENGTH:
        label = f"{parts.pop()}_{label}"
    target = env + (f"_{env_config['data']}" if isinstance(env_config.get("data"), str) else "")
    return os.path.join("eval_results", f"{slug(label)}__{slug(target)}")


def _eval_settings(args):
    """The ``EvalSettings`` of ``rllib evaluate``'s flags (its sampling one ``SamplingParams``)."""
    from rllib_dph.engines.base import SamplingParams
    from rllib_dph.evaluation import EvalSettings
    from rllib_dph.evaluation.runner import load_style_fn

    sampling = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p,
                              max_new_tokens=args.max_new_tokens, seed=args.seed)
    if args.style_fn and ":" in args.style_fn:  # a module of the launch folder imports too
        import_user_modules([args.style_fn.partition(":")[0]])
    try:
        style_fn = load_style_fn(args.style_fn) if args.style_fn else None
    except ValueError as e:
        raise SystemExit(f"rllib evaluate: --style-fn: {e}")
    return EvalSettings(
        sampling=sampling, ks=args.ks, greedy=not args.no_greedy, style_suite=args.style_suite, style_fn=style_fn,
        limit=args.limit, batch_prompts=args.batch_prompts, keep_completions=args.keep_completions, progress=True,
    )


def _refuse_unloadable(policy: str) -> None:
    """Exits with PREFLIGHT_EXIT_CODE and one line (``preflight.policy_problem``) when
    ``policy`` cannot be loaded, before a hub lookup's traceback could say it."""
    from rllib_dph.cli.preflight import policy_problem
    from rllib_dph.models.hub import absolute_if_path

    problem = policy_problem(absolute_if_path(policy))
    if problem is not None:
        print(f"rllib evaluate: {problem}", file=sys.stderr)
        raise SystemExit(PREFLIGHT_EXIT_CODE)


def _evaluate(args) -> None:
    from rllib_dph.evaluation import (
        EvalResult,
        compare,
        evaluate_policy,
        finite_or_none,
        format_summary,
        plot_pass_at_k,
        plot_style_pass_at_k,
    )

    from rllib_dph.models.build.prepare import prepare_model
    from rllib_dph.models.hub import absolute_if_path, absolute_path

    _refuse_unloadable(args.policy)
    prepare_model(absolute_if_path(args.policy))  # the preparation step: builds a bundled model not built yet, saying so
    import_user_modules(args.imports)
    env_config = json_flag(args.env_config, "--env-config")
    baseline = EvalResult.from_json(args.baseline) if args.baseline else None  # fail before evaluating
    if baseline is not None and not all(r.task_fingerprint for r in baseline.records):
        print(f"note: {args.baseline} was written before task fingerprints were recorded; its prompts are "
              "paired by task id without checking that they are the same questions.")
    result = evaluate_policy(
        absolute_if_path(args.policy),
        args.env,
        env_config,
        _eval_settings(args),
        engine=args.engine,
        dtype=args.dtype,
        device=args.device,
        engine_kwargs=json_flag(args.engine_kwargs, "--engine-kwargs"),
        name=args.name or args.policy,  # the label as typed; the policy is recorded as an absolute path
    )
    out = args.out or absolute_path(_default_eval_out(args.policy, args.env, env_config))
    others = list(args.plot)  # the baseline is drawn too
    if args.baseline and args.baseline not in others:
        others.insert(0, args.baseline)
    plotted = [result, *(EvalResult.from_json(path) for path in others)]
    written = [
        result.to_json(os.path.join(out, "results.json")),
        result.to_csv(os.path.join(out, "results.csv")),
        plot_pass_at_k(plotted, os.path.join(out, "pass_at_k.png")),
    ]
    styled = [r for r in plotted if r.solution_styles()]  # per-style bars of the runs that name styles
    if styled:
        written.append(plot_style_pass_at_k(styled, os.path.join(out, "style_pass_at_k.png")))
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
    from rllib_dph.cli.export import export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.folder, dtype=args.dtype, adapter_only=args.adapter_only)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"rllib export: {e}")
    if args.adapter_only:
        print(f"wrote a PEFT adapter folder: {out} (peft.PeftModel.from_pretrained(base_model, folder))")
    else:
        print(f"wrote a Hugging Face model folder: {out} (AutoModelForCausalLM.from_pretrained / vllm.LLM)")


def _add_train_parser(sub) -> None:
    """``rllib train [file <path> | --algo A --env E]`` and the flags of a run."""
    from rllib_dph.models.hub import absolute_path

    train = sub.add_parser("train", help="train an algorithm through Ray Tune")
    train.add_argument("target", nargs="?", choices=["file"], help="`file` to run a tuned example")
    train.add_argument("file", nargs="?", type=absolute_path, help="tuned-example .py file defining `config` [and `stop`]")
    train.add_argument("--algo", help="algorithm name, e.g. GRPO")
    train.add_argument("--env", help="env id, e.g. rllib_dph/SQL-v0")
    add_run_flags(train)
    train.set_defaults(func=_train)


def _add_build_model_parser(sub) -> None:
    """``rllib build-model [name] [--force] [--threads N]``."""
    from rllib_dph.models.hub import absolute_if_path
    from rllib_dph.models.build.tiny import BUILD_THREADS

    build = sub.add_parser(
        "build-model", help="find the shipped build of a bundled tiny model, or build it into the cache (offline)"
    )
    build.add_argument("name", nargs="?", default="tiny-sql-math", type=absolute_if_path,
                       help="bundled model name, model folder or HF id (default tiny-sql-math)")
    build.add_argument("--force", action="store_true", help="rebuild into the cache even if shipped or cached")
    build.add_argument("--threads", type=int, default=BUILD_THREADS,
                       help=f"torch threads of a build (default {BUILD_THREADS}: the shipped build's)")
    build.set_defaults(func=_build_model)


def _engine_help() -> str:
    """``--engine``'s help: every engine of the registry with its description, and the default."""
    engines = "; ".join(f"{name}: {spec.description}" for name, spec in sorted(ENGINES.items()))
    return f"rollout engine ({engines}; default {DEFAULT_ENGINE})"


def _pef_samples(text: str):
    """``--pef-samples``: "all", "refine" or an integer."""
    return int(text) if text.isdigit() else text


def _add_presample_parser(sub) -> None:
    """``rllib presample --out DIR ...``: DPH-RL pre-sampling."""
    from rllib_dph.models.hub import absolute_if_path, absolute_path

    pre = sub.add_parser("presample", help="DPH-RL pre-sampling: split prompts into D_pef / D_exp")
    pre.add_argument("--model", default="tiny-sql-math", type=absolute_if_path, help="base policy (name, path or HF id)")
    pre.add_argument("--env", default="rllib_dph/SQL-v0", help="env id")
    pre.add_argument("--env-config", help='env kwargs as JSON, e.g. \'{"data": "sql_synth/train"}\'')
    pre.add_argument("--out", required=True, type=absolute_path, help="output directory (resumes if it has parts)")
    pre.add_argument("--k", type=int, default=8, help="samples per prompt (default 8)")
    pre.add_argument("--min-correct", type=int, default=7, help="m of k correct for D_pef (default 7)")
    pre.add_argument("--pef-samples", type=_pef_samples, default="refine",
                     help="reference trajectories per D_pef prompt: all (every correct sample of the k; "
                          "the paper's '8 of 8' recipe), refine (one refinement sample, default) or N")
    pre.add_argument("--full-data", action="store_true",
                     help="keep every prompt in D_exp too (the paper's Table 4 'Full Data', with --min-correct 1)")
    pre.add_argument("--temperature", type=float, default=1.0)
    pre.add_argument("--top-p", type=float, default=1.0)
    pre.add_argument("--max-new-tokens", "--max-response-length", dest="max_new_tokens", type=int, default=128,
                     help="training's max_response_length (default 128; --max-response-length: the old spelling)")
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--prompts-per-chunk", type=int, default=64)
    pre.add_argument("--engine", default=DEFAULT_ENGINE, choices=sorted(ENGINES), help=_engine_help())
    pre.add_argument("--engine-kwargs", help="engine kwargs as JSON")
    pre.add_argument("--dtype", default="float32")
    add_import_flag(pre)
    pre.set_defaults(func=_presample)


def _add_evaluate_parser(sub) -> None:
    """``rllib evaluate <policy> ...``: pass@k and friends of a checkpoint or model."""
    from rllib_dph.models.hub import absolute_path

    ev = sub.add_parser(
        "evaluate",
        help="pass@k / greedy / maj@k / styles of a checkpoint or model on an env split",
        description="Evaluate a policy: n samples and one greedy completion per prompt. Writes "
        "results.json, results.csv (one row per prompt), pass_at_k.png and, when the env names solution "
        "styles, style_pass_at_k.png (pass@k per style) into --out.",
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
    ev.add_argument("--style-fn", metavar="MODULE:FUNCTION",
                    help="your style function (completion, task) -> style or None; per-style pass@k with it")
    ev.add_argument("--limit", type=int, help="evaluate only the first N prompts")
    ev.add_argument("--batch-prompts", type=int, default=16, help="prompts per generate call (default 16)")
    ev.add_argument("--keep-completions", action="store_true", help="store completion texts in the JSON")
    ev.add_argument("--baseline", type=absolute_path, help="results.json of the base model: keep / exploration rates, and plotted")
    ev.add_argument("--plot", nargs="+", default=[], type=absolute_path, help="more results.json files to draw on the same plot")
    ev.add_argument("--out", type=absolute_path, help="output folder (default eval_results/<policy>__<env>_<data>)")
    ev.add_argument("--name", help="label of this run in plots (default: the policy argument)")
    ev.add_argument("--engine", default=DEFAULT_ENGINE, help=_engine_help())
    ev.add_argument("--engine-kwargs", help="engine kwargs as JSON")
    ev.add_argument("--dtype", help="weight dtype (default: the checkpoint's)")
    ev.add_argument("--device", default="cpu", help="device of the engine (default cpu)")
    add_import_flag(ev)
    ev.set_defaults(func=_evaluate)


def _add_export_parser(sub) -> None:
    """``rllib export <checkpoint> <folder>``."""
    from rllib_dph.models.hub import absolute_path

    exp = sub.add_parser("export", help="write a checkpoint's policy as a Hugging Face model folder")
    exp.add_argument("checkpoint", type=absolute_path, help="Algorithm checkpoint folder (Tune checkpoint_00000N)")
    exp.add_argument("folder", type=absolute_path, help="output folder (safetensors, config, tokenizer, chat template)")
    exp.add_argument("--dtype", help="weight dtype of the export (default: float32 as trained)")
    exp.add_argument("--adapter-only", action="store_true",
                     help="LoRA checkpoints: write the PEFT adapter folder instead of the merged model")
    exp.set_defaults(func=_export)


def _build_parser() -> argparse.ArgumentParser:
    """The ``rllib`` argument parser: one subcommand per ``_add_*_parser``."""
    parser = argparse.ArgumentParser(prog="rllib", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    _add_build_model_parser(sub)
    _add_presample_parser(sub)
    _add_evaluate_parser(sub)
    _add_export_parser(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    """Runs ``rllib <command> ...`` (``argv`` default: the process's arguments)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _build_parser().parse_args(argv)
    args.command = ["rllib", *argv]  # repeated by the commands a run prints
    exit_on_ctrl_c(lambda: args.func(args))
