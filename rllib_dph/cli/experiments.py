"""Experiment runners: an algorithm config through Ray Tune, as ``rllib train`` and tuned examples run it.

``rllib train`` (``rllib_dph.cli.main``) and a tuned example run as a script
(``python tuned_examples/grpo/sql_tiny_grpo.py --stop JSON``, through :func:`run_tuned_example`)
share the flags of a run (:func:`add_run_flags`) and :func:`run_from_args`, which

1. checks every setting before Ray starts (:func:`check_run`, ``rllib_dph.cli.preflight``);
2. builds the bundled models it needs and runs DPH pre-sampling in this process (:func:`prepare_run`);
3. runs the experiment through Ray Tune (:func:`run_experiment`), so results, checkpoints and
   TensorBoard files land in the usual Tune output directory (``--storage-path``, default
   ``~/ray_results``), one folder per run.

Benchmarks and tests read a tuned example's ``config`` and ``stop`` with :func:`load_tuned_example`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import runpy
import shlex
import sys
import time
from typing import Any, Callable, Optional

from rllib_dph.cli.imports import add_import_flag, import_user_modules, ray_runtime_env

#: Exit code of a run refused by the preflight checks.
PREFLIGHT_EXIT_CODE = 2
#: Exit code of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT_CODE = 130
#: Where Tune writes experiments unless ``--storage-path`` says otherwise.
DEFAULT_STORAGE_PATH = "~/ray_results"
#: Iterations between checkpoints unless ``--checkpoint-freq`` says otherwise: a crash or a
#: second Ctrl-C loses at most this many iterations.
DEFAULT_CHECKPOINT_FREQ = 10
#: Checkpoints kept per trial, the latest (``--keep-checkpoints-num``): with two, a crash while
#: one is written still leaves the one before.
DEFAULT_KEEP_CHECKPOINTS = 2
#: The lock file in an experiment folder, held by the ``rllib train`` that writes the folder.
EXPERIMENT_LOCK = ".rllib_train.lock"


def exit_on_ctrl_c(run: Callable[[], Any]) -> None:
    """Runs ``run()``; Ctrl-C that reaches it as ``KeyboardInterrupt`` (outside Tune's loop, which
    handles it itself: ``rllib_dph.cli.interrupt``) exits with :data:`INTERRUPTED_EXIT_CODE` and one
    line instead of a traceback."""
    try:
        run()
    except KeyboardInterrupt:
        print("\nrllib: interrupted (Ctrl-C).", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None


def json_flag(text: Optional[str], flag: str) -> dict:
    """The JSON object given to a flag such as ``--config`` ({} when the flag is absent or empty).

    Raises:
        SystemExit: ``text`` is not valid JSON or not a JSON object (the message names ``flag``).
    """
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"rllib: {flag} is not valid JSON ({e.msg} at char {e.pos}): {text!r}")
    if not isinstance(value, dict):
        raise SystemExit(f"rllib: {flag} must be a JSON object like '{{\"key\": 1}}', got {text!r}")
    return value


#: Longest folder name :func:`slug` makes.
SLUG_LENGTH = 80


def slug(text: str) -> str:
    """``text`` as a folder name: runs of characters other than letters, digits, ``_.-`` become
    ``_``; at most its last :data:`SLUG_LENGTH` characters, never starting or ending with one of
    ``_.-`` (a leading ``-`` would read as an option to the shell's commands)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[-SLUG_LENGTH:].strip("_.-")


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
    return f"{config.algo_class.__name__}_{slug(str(config.env))}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def run_experiment(
    config,
    stop: dict,
    *,
    storage_path: Optional[str] = None,
    name: Optional[str] = None,
    checkpoint_freq: int = DEFAULT_CHECKPOINT_FREQ,
    checkpoint_at_end: bool = True,
    keep_checkpoints: Optional[int] = DEFAULT_KEEP_CHECKPOINTS,
    num_samples: int = 1,
    resume: bool = False,
    verbose: int = 0,
    callbacks: Optional[list] = None,
    user_modules: tuple = (),
    force: bool = False,
    hold: bool = True,
):
    """Runs ``config`` through Ray Tune until ``stop``; returns Tune's ``ResultGrid``.

    Once Ray has started, a trial that asks for more CPUs or GPUs than the cluster has is refused
    (``preflight.resource_problems``; Tune would keep it pending), unless ``force``. Ctrl-C stops
    the running trials after their current iteration, each with a checkpoint
    (``rllib_dph.cli.interrupt``); they come back unfinished (:func:`unfinished_trials`).

    Args:
        keep_checkpoints: Checkpoints kept per trial, the latest; None keeps all.
        resume: Continue the experiment ``storage_path/name`` (``resume_problems`` says whether it can).
        verbose: 0 prints one line per iteration (``rllib_dph.cli.console``); 1-3 are Tune's own
            verbosity levels (status table, config, results).
        callbacks: More Tune callbacks (e.g. ``rllib_dph.cli.tracking.logger_callbacks``).
        user_modules: Modules that every Ray worker imports first (``--import``).
        hold: Take the experiment folder for this process (:func:`hold_experiment`) once Ray has
            started and the resources fit; False where the caller holds it already.
    """
    from rllib_dph.cli.console import IterationPrinter
    from rllib_dph.cli.interrupt import GracefulInterrupt
    from rllib_dph.models.hub import absolute_path

    _start_ray(verbose, user_modules)
    _refuse([] if force else _resource_problems(config))
    storage_path = absolute_path(storage_path or DEFAULT_STORAGE_PATH)
    name = name or default_experiment_name(config)
    callbacks = [*(callbacks or []), *([IterationPrinter()] if verbose == 0 else []), GracefulInterrupt()]
    experiment_dir = os.path.join(storage_path, name)
    with hold_experiment(experiment_dir) if hold else contextlib.nullcontext():
        results = _fit(config, stop, experiment_dir, resume=resume, verbose=verbose, callbacks=callbacks,
                       checkpoint_freq=checkpoint_freq, checkpoint_at_end=checkpoint_at_end,
                       keep_checkpoints=keep_checkpoints, num_samples=num_samples)
    _exit_on_failed_trials(results, verbose)
    return results


def _fit(config, stop: dict, experiment_dir: str, *, resume: bool, verbose: int, callbacks: list, checkpoint_freq: int,
         checkpoint_at_end: bool, keep_checkpoints: Optional[int], num_samples: int):
    """Tune's ``ResultGrid`` of ``config`` run (or, with ``resume``, continued) in ``experiment_dir``."""
    from ray import tune

    from rllib_dph.cli.interrupt import catching_ctrl_c

    storage_path, name = os.path.split(experiment_dir)
    if resume:  # the experiment's own stop and callbacks (resume_problems checked that it can)
        print(resume_line(experiment_dir), flush=True)
        drop_stale_decisions(experiment_dir)
        tuner = tune.Tuner.restore(experiment_dir, trainable=config.algo_class, resume_errored=True)
    else:
        checkpoints = tune.CheckpointConfig(checkpoint_frequency=checkpoint_freq, checkpoint_at_end=checkpoint_at_end,
                                            num_to_keep=keep_checkpoints)
        run = tune.RunConfig(name=name, storage_path=storage_path, stop=stop, verbose=verbose, callbacks=callbacks,
                             checkpoint_config=checkpoints)
        tuner = tune.Tuner(config.algo_class, param_space=config, tune_config=tune.TuneConfig(num_samples=num_samples),
                           run_config=run)
    print(f"rllib: experiment folder {experiment_dir} (tensorboard --logdir {experiment_dir})", flush=True)
    with catching_ctrl_c():
        return tuner.fit()


def drop_stale_decisions(experiment_dir: str) -> list[str]:
    """Empties the trial decisions that Tune's experiment state in ``experiment_dir`` kept from the
    process that wrote it; returns the trial ids that had one.

    Tune 2.60 caches a STOP for a trial that stops while it saves a checkpoint and applies it once
    that save resolves; a trial that fails in the save (a full disk, a kill) never resolves it, so
    the STOP stays in the saved state, and ``Tuner.restore`` would stop the resumed trial after
    its first checkpoint, short of its stop criteria. A resumed trial continues from its
    checkpoint, so no decision of the earlier process applies to it.
    """
    import glob

    from rllib_dph.files import write_json_atomic

    dropped = []
    for path in glob.glob(os.path.join(experiment_dir, "experiment_state-*.json")):
        with open(path) as f:
            state = json.load(f)
        runner = state.get("runner_data", {})
        stale = {**runner.get("_cached_trial_decisions", {}), **runner.get("_queued_trial_decisions", {})}
        if stale:
            runner["_cached_trial_decisions"], runner["_queued_trial_decisions"] = {}, {}
            write_json_atomic(path, state, indent=None)
            dropped += sorted(stale)
    return dropped


def _resource_problems(config) -> list:
    """``preflight.resource_problems`` of ``config`` against the running Ray cluster."""
    import ray

    from rllib_dph.cli.preflight import resource_problems

    return resource_problems(config, ray.cluster_resources())


def unfinished_trials(results) -> list:
    """The trials of ``results`` that neither failed nor ended: Tune stopped them on Ctrl-C
    (Tune marks a trial's last result ``done`` when a stop criterion is met, the first one met
    as RLlib and Tune stop)."""
    return [r for r in results if not r.error and not r.metrics.get("done")]


def resume_problems(experiment_dir: str, stop: dict) -> list:
    """What ``--resume`` of ``experiment_dir`` could not do as asked, each a ``preflight.Problem``:

    - no Tune experiment there (Tune would start a new one over its folder);
    - a stop other than the one the experiment was started with (``stop`` non-empty): Tune
      continues an experiment with its own stop, so the new one would be ignored;
    - a trial that trained but saved no checkpoint: Tune would train it again from iteration 1,
      over its results.
    """
    from ray import tune

    from rllib_dph.algorithms.checkpoints import CheckpointError, intact_checkpoint, newest_intact
    from rllib_dph.cli.preflight import Problem

    if not tune.Tuner.can_restore(experiment_dir):
        return [Problem("--resume", f"{experiment_dir} holds no Tune experiment to continue (no experiment state); "
                                    "give the --name and --storage-path the run was started with, or start it without --resume.")]
    try:
        trials = _trials(experiment_dir)
    except Exception as e:  # a state file cut short (a full disk) fails in json, pickle or Tune's own code
        newest = newest_intact(experiment_dir)
        return [Problem("--resume", (
            f"the experiment state in {experiment_dir} cannot be read ({type(e).__name__}: {e}), so Tune cannot "
            "continue it; " + (f"start a new run from its newest intact checkpoint: rllib train ... --from-checkpoint "
                               f"{newest} --name <new name>" if newest else "it holds no intact checkpoint either")
        ))]
    started_with = _stop_of(trials)
    problems = []
    if stop and stop != started_with:
        latest = [t.checkpoint.path for t in trials if t.checkpoint is not None]
        problems.append(Problem("--stop", (
            f"{json.dumps(stop)} is not the stop {json.dumps(started_with)} that {experiment_dir} was started with, "
            "and --resume continues a run with its own stop. Resume without --stop (or with the same one); to train "
            f"further or to another stop, start a new run from a checkpoint: rllib train ... --from-checkpoint "
            f"{latest[-1] if latest else '<a trial checkpoint_00000N folder>'} --stop '{json.dumps(stop)}' --name <new name>"
        )))
    for trial in trials:
        trained = _result_rows(trial.path)
        if trial.status != "TERMINATED" and trial.checkpoint is not None:
            try:  # the trial falls back the same way (GRPO.load_checkpoint); said here, in the driver
                intact_checkpoint(trial.checkpoint.path, warn=_warn)
            except CheckpointError as e:
                problems.append(Problem("--resume", f"trial {trial.path}: {e}"))
        if trial.status != "TERMINATED" and trial.checkpoint is None and trained:
            problems.append(Problem("--resume", (
                f"trial {trial.path} trained {trained} iteration(s) but saved no checkpoint, so --resume would train it "
                "again from iteration 1 over its results. Start a new run under another --name (--checkpoint-freq N "
                "checkpoints every N iterations)."
            )))
    return problems


def _warn(message: str) -> None:
    print(f"rllib: warning: {message}", file=sys.stderr, flush=True)


def _result_rows(trial_dir: str) -> int:
    """Results a trial wrote (lines of its ``result.json``; the experiment state may be older)."""
    path = os.path.join(trial_dir, "result.json")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def _trials(experiment_dir: str) -> list:
    """The trials of the Tune experiment in ``experiment_dir``, as its state file last saved them."""
    from ray import tune

    return tune.ExperimentAnalysis(experiment_dir).trials


def _stop_of(trials: list) -> dict:
    """The stop criteria an experiment's trials were started with (one for all)."""
    return dict(trials[0].stopping_criterion) if trials else {}


def resume_line(experiment_dir: str) -> str:
    """What ``--resume`` of ``experiment_dir`` continues: its unfinished trials, to its stop."""
    trials = _trials(experiment_dir)
    unfinished = [t for t in trials if t.status != "TERMINATED"]
    stop = json.dumps(_stop_of(trials))
    if not unfinished:
        return (f"rllib: --resume: every trial of {experiment_dir} has finished (stop {stop}); nothing to train. To train "
                "further, start a new run with --from-checkpoint (the final checkpoints are printed below).")
    return (f"rllib: --resume: continuing {len(unfinished)} of {len(trials)} trial(s) of {experiment_dir}, each from its "
            f"latest checkpoint, to the stop it was started with, {stop} (the first criterion met stops a trial).")


def restore_on_init(checkpoint: str, algorithm, **kwargs) -> None:
    """``on_algorithm_init`` callback of ``--from-checkpoint``: loads the Algorithm state saved in
    ``checkpoint`` (weights, optimizer, iteration count) into the new trial's Algorithm."""
    algorithm.restore_from_path(checkpoint)


def continue_from_checkpoint(config, checkpoint: str):
    """A copy of ``config`` whose Algorithm starts from ``checkpoint`` (RLlib's ``on_algorithm_init``
    restore), so a new run trains a finished one further up to a new stop."""
    import functools

    return config.copy(copy_frozen=False).callbacks(on_algorithm_init=functools.partial(restore_on_init, checkpoint))


def _start_ray(verbose: int, user_modules: tuple) -> None:
    """``ray.init`` (quiet unless ``verbose``; every worker imports ``user_modules`` first) and
    the Tune names of the registered envs."""
    import ray

    from rllib_dph import envs
    from rllib_dph.cli.console import quiet_logging

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
    from rllib_dph.cli.console import error_summary

    failed = [r for r in results if r.error]
    if failed:
        first = failed[0]
        detail = f"{error_summary(first.error)}\n  full traceback: {os.path.join(first.path, 'error.txt')}"
        raise SystemExit(f"rllib: {len(failed)} trial(s) failed; first error: " + (str(first.error) if verbose else detail))


def _count(text: str) -> int:
    """An argument that is an int >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the flags of one run (read by :func:`run_from_args`) to ``parser``."""
    from rllib_dph.models.hub import absolute_path

    parser.add_argument(
        "--config",
        help="config overrides as JSON, e.g. '{\"model_name\": \"Qwen/Qwen2.5-0.5B\", "
        "\"env_config\": {\"data\": \"train.parquet\"}}'",
    )
    parser.add_argument("--stop", help="stop criteria as JSON, e.g. '{\"training_iteration\": 2}'")
    parser.add_argument("--storage-path", type=absolute_path, help="Tune output directory (default ~/ray_results)")
    parser.add_argument("--name", help="experiment name (default: <algo>_<env>_<date>_<time>, new per run)")
    parser.add_argument(
        "--checkpoint-freq", type=int, default=DEFAULT_CHECKPOINT_FREQ,
        help=f"checkpoint every N iterations (default {DEFAULT_CHECKPOINT_FREQ}; 0: only at the end)",
    )
    parser.add_argument(
        "--checkpoint-at-end", action=argparse.BooleanOptionalAction, default=True,
        help="checkpoint when stopping (default; --no-checkpoint-at-end to skip)",
    )
    parser.add_argument(
        "--keep-checkpoints-num", type=_count, default=DEFAULT_KEEP_CHECKPOINTS, metavar="N",
        help=f"keep the latest N checkpoints of each trial (default {DEFAULT_KEEP_CHECKPOINTS}; 0: keep all)",
    )
    parser.add_argument(
        "--from-checkpoint", type=absolute_path, metavar="CHECKPOINT",
        help="start from this Algorithm checkpoint (weights, optimizer, iteration count), e.g. to train a "
        "finished run further with a larger --stop",
    )
    parser.add_argument("--num-samples", type=int, default=1, help="Tune samples of the config")
    parser.add_argument(
        "--resume", action="store_true",
        help="continue the interrupted or failed experiment named by --name, each trial from its last checkpoint, "
        "to the stop it was started with",
    )
    parser.add_argument(
        "--force", action="store_true",
        help="start even when the estimated peak memory exceeds this machine's RAM or GPU memory, or a trial "
        "asks for more CPUs or GPUs than the Ray cluster has (a cluster that adds nodes for pending trials)",
    )
    parser.add_argument(
        "-v", "--verbose", type=int, nargs="?", const=1, default=0,
        help="0 (default): one line per iteration; 1-3 (--verbose = 1): Tune's own status table",
    )
    parser.add_argument("--wandb-project", help="log to this W&B project (pip install \"rllib_dph[tracking]\")")
    parser.add_argument("--wandb-offline", action="store_true", help="W&B offline mode (sync later)")
    parser.add_argument("--mlflow-tracking-uri", help="log to MLflow: a tracking URI or a local folder (file store)")
    add_import_flag(parser)


def _refuse(problems: list) -> None:
    """Prints the preflight problems once, to stderr, and exits with PREFLIGHT_EXIT_CODE."""
    from rllib_dph.cli.preflight import format_problems

    if problems:
        print(format_problems(problems), file=sys.stderr)
        raise SystemExit(PREFLIGHT_EXIT_CODE)


def check_run(config, stop: dict, args, overrides: dict) -> None:
    """Preflight of a run (applies ``overrides`` to ``config``): every problem of the config, stop,
    paths and trackers, printed once, then the memory estimate (refused unless ``--force``);
    exits with PREFLIGHT_EXIT_CODE on any problem. A ``--from-checkpoint`` that is incomplete or
    damaged is replaced in ``args`` by the newest intact checkpoint of its trial, with a warning
    (``algorithms.checkpoints.intact_checkpoint``)."""
    from rllib_dph.cli.preflight import Problem, memory_problems, preflight
    from rllib_dph.cli.tracking import tracking_problems

    problems = preflight(config, stop, config_overrides=overrides)
    tracking = tracking_problems(wandb_project=args.wandb_project, mlflow_tracking_uri=args.mlflow_tracking_uri)
    problems += [Problem("tracking", message) for message in tracking]
    if args.resume and not args.name:
        problems.append(Problem("--resume", "needs --name: the experiment folder to continue."))
    elif args.resume and not args.from_checkpoint:
        problems += resume_problems(experiment_dir(args), stop)
    if args.from_checkpoint and args.resume:
        problems.append(Problem("--from-checkpoint", "starts a new run; drop --resume (which continues an interrupted one)."))
    if args.from_checkpoint and not os.path.isfile(os.path.join(args.from_checkpoint, "rllib_checkpoint.json")):
        problems.append(Problem(
            "--from-checkpoint",
            f"{args.from_checkpoint} is not an Algorithm checkpoint (no rllib_checkpoint.json); give a "
            "trial's checkpoint_00000N folder.",
        ))
    elif args.from_checkpoint:
        from rllib_dph.algorithms.checkpoints import CheckpointError, intact_checkpoint

        try:  # a damaged one is replaced by the newest intact one of its trial, with a warning
            args.from_checkpoint = intact_checkpoint(args.from_checkpoint, warn=_warn)
        except CheckpointError as e:
            problems.append(Problem("--from-checkpoint", str(e)))
    _refuse(problems)
    _refuse(memory_problems(config, force=args.force))


def prepare_run(config) -> None:
    """Work that must not happen inside a Tune trial, done here with in-place progress bars.

    Builds each bundled model the variants name (policy and reference) that has no current build
    yet, saying so on stderr (``models.build.prepare.prepare_models``), and makes each DPH
    variant's D_pef file ready as ``DPH.setup`` would (``presample.prepare_pef``: pre-samples
    ``presample.out_dir`` when it has no files for this model, data and sampling settings, so the
    trial finds them); a D_pef file that cannot be used is refused here, before Ray starts.
    """
    from rllib_dph.models.build.prepare import prepare_models
    from rllib_dph.cli.preflight import Problem, search_variants

    variants = search_variants(config)
    for variant in variants:
        prepare_models((variant.model_name, variant.reference_model_name))
    for variant in variants:
        if getattr(variant, "resolved_pef_path", None):  # DPH
            from rllib_dph.algorithms.dph.presample import PefFileError, prepare_pef

            try:
                prepare_pef(variant)  # one pre-sampling per folder, also across commands
            except PefFileError as e:
                _refuse([Problem(type(variant).__name__, str(e))])


def hold_experiment(folder: str) -> contextlib.ExitStack:
    """Takes the experiment folder ``folder`` for this process (the ``flock`` of
    :data:`EXPERIMENT_LOCK` in it, created with the folder); close the returned stack to give it
    back. A process that dies gives it back by itself, so a killed run never blocks the next one.

    Two runs of one ``--storage-path`` and ``--name``, or a ``--resume`` of a run still training,
    would write one experiment state and one trial's results from two processes: the second is
    refused (exit PREFLIGHT_EXIT_CODE), naming the folder and the process that holds it.
    """
    from rllib_dph.cli.preflight import Problem
    from rllib_dph.files import LockTimeout, file_lock

    stack = contextlib.ExitStack()
    try:
        stack.enter_context(file_lock(os.path.join(folder, EXPERIMENT_LOCK), timeout_s=0, what="the experiment folder"))
    except LockTimeout as e:
        _refuse([Problem("--name", (
            f"the experiment folder {folder} is in use by another rllib train ({e.holder}): two runs of one "
            "--storage-path and --name, or a --resume of a run still training, would write one trial from two "
            "processes. Wait for that run to end (or stop it: Ctrl-C saves a checkpoint, and --resume continues "
            "it), or give another --name."
        ))])
    return stack


def experiment_dir(args: argparse.Namespace) -> str:
    """The folder of the experiment that ``--storage-path`` and ``--name`` name."""
    from rllib_dph.models.hub import absolute_path

    return os.path.join(absolute_path(args.storage_path or DEFAULT_STORAGE_PATH), args.name)


def run_from_args(config, stop: dict, args: argparse.Namespace) -> None:
    """Checks, prepares and runs ``config`` until ``stop`` with the flags of :func:`add_run_flags`.

    At the end it prints each trial's result and checkpoint, and how to evaluate the final
    checkpoint and train it further. A run stopped by Ctrl-C prints, per unfinished trial, the
    iteration it stopped at and its checkpoint, then the command that continues the run
    (``--resume``), and exits with :data:`INTERRUPTED_EXIT_CODE`.

    Args:
        config: The algorithm config; ``--config`` overrides are applied to it.
        stop: Stop criteria; ``--stop`` entries replace or add to them.
        args: The parsed flags of :func:`add_run_flags`, and ``args.command``: the words of the
            command that started the run (``["rllib", "train", ...]``), which the printed
            commands repeat.
    """
    from rllib_dph.cli.console import quiet_logging

    if args.verbose == 0:
        quiet_logging()
    overrides = json_flag(args.config, "--config")
    stop = {**stop, **json_flag(args.stop, "--stop")}
    user_modules = import_user_modules(args.imports)
    name = args.name or default_experiment_name(config)
    folder = experiment_dir(argparse.Namespace(storage_path=args.storage_path, name=name))
    # An existing folder may be another run's, still training: refused before its state is read. A
    # new one is made (and held) by run_experiment once every check passed, so a refused run leaves none.
    with hold_experiment(folder) if os.path.isdir(folder) else contextlib.nullcontext() as held:
        _run_checked(config, stop, args, overrides, name, user_modules, held=held is not None)


def _run_checked(config, stop: dict, args: argparse.Namespace, overrides: dict, name: str, user_modules: list,
                 *, held: bool) -> None:
    """:func:`run_from_args` from its checks on; ``held``: this process holds the experiment folder."""
    from rllib_dph.cli.tracking import logger_callbacks

    check_run(config, stop, args, overrides)
    prepare_run(config)
    if args.from_checkpoint:
        config = continue_from_checkpoint(config, args.from_checkpoint)
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
        keep_checkpoints=args.keep_checkpoints_num or None,
        num_samples=args.num_samples,
        resume=args.resume,
        verbose=args.verbose,
        callbacks=callbacks,
        user_modules=tuple(user_modules),
        force=args.force,
        hold=not held,
    )
    unfinished = unfinished_trials(results)
    if unfinished:
        _print_interrupted(unfinished, args.command, name)
        raise SystemExit(INTERRUPTED_EXIT_CODE)
    _print_next_steps(_print_summary(results), args, name)


def _without_flags(words: list[str], flags: dict[str, bool]) -> list[str]:
    """``words`` without the flags named in ``flags`` (name → whether it takes a value), in
    either spelling (``--name x``, ``--name=x``)."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in flags:
            skip = flags[word]
        elif word.split("=", 1)[0] not in flags:
            kept.append(word)
    return kept


def resume_command(command: list[str], name: str) -> str:
    """The shell command that continues the run ``command`` started, named ``name``: the same
    command with ``--name <name> --resume`` (and without ``--from-checkpoint``, which the
    experiment keeps)."""
    words = _without_flags(command, {"--resume": False, "--name": True, "--from-checkpoint": True})
    return shlex.join([*words, "--name", name, "--resume"])


def _checkpoint_iteration(result) -> Optional[int]:
    """The training iteration of the trial's latest checkpoint (None without one)."""
    if result.checkpoint is None:
        return None
    saved = {c.path: metrics.get("training_iteration") for c, metrics in (result.best_checkpoints or [])}
    return saved.get(result.checkpoint.path)


def _print_interrupted(unfinished: list, command: list[str], name: str) -> None:
    """Per unfinished trial: the iteration it stopped at and what ``--resume`` continues from;
    then the command that continues the run."""
    for result in unfinished:
        iteration = result.metrics.get("training_iteration") or 0
        if result.checkpoint is None:
            start = "no checkpoint: --resume starts it at iteration 1"
        else:
            start = f"checkpoint {result.checkpoint.path} (iteration {_checkpoint_iteration(result)})"
        print(f"rllib: trial {result.path} interrupted at iteration {iteration}; {start}")
    iterations = sorted({r.metrics.get("training_iteration") or 0 for r in unfinished})
    at = f" at iteration {iterations[0]}" if len(iterations) == 1 else ""
    print(f"rllib: interrupted{at}; continue with: {resume_command(command, name)}", flush=True)


def _print_next_steps(best, args: argparse.Namespace, name: str) -> None:
    """The final checkpoint of ``best`` (the only or best trial) and the commands that evaluate it
    and train it further."""
    if best is None or best.checkpoint is None:
        print("rllib: no checkpoint was saved (--no-checkpoint-at-end)")
        return
    checkpoint = best.checkpoint.path
    config = best.config
    env_config = {**(config.get("env_config") or {}), **(config.get("val_env_config") or {})}
    imports = [word for module in args.imports for word in ("--import", module)]
    evaluate = ["rllib", "evaluate", checkpoint, "--env", str(config.get("env")),
                *(["--env-config", json.dumps(env_config)] if env_config else []), *imports]
    iteration = best.metrics.get("training_iteration") or 0
    further = [*_without_flags(args.command, {"--resume": False, "--name": True, "--from-checkpoint": True,
                                              "--stop": True}),
               "--from-checkpoint", checkpoint, "--stop", json.dumps({"training_iteration": 2 * iteration}),
               "--name", f"{name}_more"]
    print(f"rllib: final checkpoint {checkpoint}")
    print(f"  evaluate it:          {shlex.join(evaluate)}")
    print(f"  train it further, e.g. to iteration {2 * iteration}: {shlex.join(further)}", flush=True)


#: The validation style entropy (bits) in a trial's results, shown next to the selection metric.
STYLE_ENTROPY = "evaluation/style_entropy_bits"


def _print_summary(results):
    """One line per trial (and its checkpoint) and, with several trials, the best one and any
    tie; returns the best trial (the only one of a single trial; None when none has the metric).

    The best trial is chosen by validation pass@k at the largest k of the trials' last held-out
    evaluation (``GRPOConfig.held_out``) when they ran one, else by the training reward; trials
    whose value equals the best are reported as tied. Each trial's line also shows its validation
    style entropy when the held-out env names solution styles (what a sweep over η trades for).
    """
    metric = _selection_metric(results)
    for result in results:
        entropy = _metric_value(result.metrics, STYLE_ENTROPY)
        print(
            f"trial {result.path}: training_iteration={result.metrics.get('training_iteration')} "
            f"{metric}={_metric_value(result.metrics, metric)}"
            + ("" if entropy is None else f" {STYLE_ENTROPY}={entropy:.2f}")
        )
        if result.checkpoint is not None:
            print(f"  checkpoint {result.checkpoint.path}")
    if len(results) < 2:
        return results[0] if len(results) else None
    scored = [r for r in results if _metric_value(r.metrics, metric) is not None]
    if not scored:
        return None
    best = max(scored, key=lambda r: _metric_value(r.metrics, metric))  # the first of equals
    best_value = _metric_value(best.metrics, metric)
    print(f"best trial by {metric}: {best.path}")
    configs = [r.config for r in results]
    varied = sorted(k for k in best.config if len({repr(c.get(k)) for c in configs}) > 1)
    print(f"best trial's swept values: {json.dumps({k: best.config[k] for k in varied}, default=str)}")
    tied = [r for r in scored if r is not best and _metric_value(r.metrics, metric) == best_value]
    for other in tied:
        values = json.dumps({k: other.config.get(k) for k in varied}, default=str)
        print(f"tie: {other.path} ({values}) has the same {metric}={best_value}; the runs cannot tell them apart")
    return best


def _selection_metric(results) -> str:
    """``evaluation/pass@<largest k>`` when every trial has a held-out evaluation, else the training reward."""
    ks = [
        {int(key[len("pass@") :]) for key in (r.metrics.get("evaluation") or {}) if key.startswith("pass@")}
        for r in results
    ]
    common = set.intersection(*ks) if ks else set()
    return f"evaluation/pass@{max(common)}" if common else "env_runners/episode_return_mean"


def _metric_value(metrics: dict, metric: str):
    """``metrics["a"]["b"]`` for ``metric="a/b"`` (None when absent)."""
    value = metrics
    for part in metric.split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def run_tuned_example(config, stop: dict, argv: Optional[list[str]] = None) -> None:
    """``python <tuned_example.py> [--stop JSON] ...``: what ``rllib train file`` does."""
    parser = argparse.ArgumentParser(description="Run this tuned example through Ray Tune.")
    add_run_flags(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.command = ["python", sys.argv[0], *argv]
    exit_on_ctrl_c(lambda: run_from_args(config, stop, args))


