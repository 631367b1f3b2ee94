"""Running an evaluation: the settings, the loop over an env's prompts, and loading a policy.

For every prompt of an env split the policy draws ``n`` samples (temperature / top-p) and, by
default, one greedy completion, through :func:`rllib_dph.rollout.rollout`; the env scores each
and names its majority-vote answer, solution style and solution (``rllib_dph.envs.base.VerifierEnv.answer_key``
/ ``solution_style`` / ``solution_key``). :func:`evaluate_engine` runs on a built engine and env (the env runner
during training); :func:`evaluate` builds both from names or an RLlib checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from rllib_dph.envs.suites import STYLE_SUITES
from rllib_dph.engines import DEFAULT_ENGINE, check_engine_name, make_engine
from rllib_dph.engines.base import RolloutEngine, SamplingParams
from rllib_dph.evaluation.metrics import NO_ANSWER_STYLE, default_ks
from rllib_dph.evaluation.results import EvalResult, PromptRecord
from rllib_dph.envs import make_env
from rllib_dph.rollout.episodes import ScoredGroup, rollout, rollout_chunks

#: How evaluation samples unless told otherwise (128 new tokens: GRPOConfig's default).
DEFAULT_SAMPLING = SamplingParams(n=16, max_new_tokens=128, seed=0)
#: Prompts per ``engine.generate`` call (16 prompts x n=16 fills the HF engine's 256-row batch).
DEFAULT_BATCH_PROMPTS = 16
#: Where an Algorithm checkpoint keeps the learner's RL modules.
RL_MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module"


@dataclass(frozen=True)
class EvalSettings:
    """How to evaluate a policy; checked when built (``ValueError`` naming the first bad field).

    Attributes:
        sampling: How each prompt's samples are drawn, one ``engines.base.SamplingParams``
            (default :data:`DEFAULT_SAMPLING`): ``n`` >= 1, ``temperature`` > 0; prompt chunk j
            is sampled with seed ``seed + j`` (None counts as 0), so the same seed,
            ``batch_prompts`` and weights give the same samples.
        ks: The k of pass@k and maj@k, each in [1, n]; None (default) becomes 1, 2, 4, ... <= n
            and n (:func:`~rllib_dph.evaluation.metrics.default_ks`).
        greedy: Also generate one greedy completion per prompt (greedy accuracy).
        style_suite: Suite whose style function names the solution styles (one of
            ``rllib_dph.envs.suites.STYLE_SUITES``); None uses each task's ``data_source`` when it is one
            of them and records no styles otherwise.
        style_fn: Your own style function, ``style_fn(completion, task) -> str | None`` (``task``
            the env's ``rllib_dph.envs.base.Task``), called on every sampled completion; it
            replaces the env's styles. None (no style, e.g. no answer) is recorded as ``"none"``,
            which no style metric counts. The per-style pass@k counts a sample of style s only
            when it is correct, so a function that names the shape of any answer gives the
            pass@k of each shape among correct answers. Give it or ``style_suite``, not both;
            ``rllib evaluate --style-fn module:function`` (:func:`load_style_fn`).
        limit: Evaluate only the first ``limit`` tasks (>= 1); None evaluates all.
        batch_prompts: Prompts per ``generate`` call, >= 1.
        keep_completions: Keep the completion texts in the records.
        progress: Show a progress bar over prompts on stderr when it is a terminal.
    """

    sampling: SamplingParams = DEFAULT_SAMPLING
    ks: Optional[Sequence[int]] = None
    greedy: bool = True
    style_suite: Optional[str] = None
    style_fn: Optional[Callable[[str, Any], Optional[str]]] = None
    limit: Optional[int] = None
    batch_prompts: int = DEFAULT_BATCH_PROMPTS
    keep_completions: bool = False
    progress: bool = False

    def __post_init__(self):
        ks, sampling = list(self.ks or ()), self.sampling
        rules = [
            (sampling.n >= 1, f"sampling.n={sampling.n} samples per prompt must be >= 1"),
            (
                sampling.temperature > 0,
                f"sampling.temperature={sampling.temperature} must be > 0 for the n samples (greedy=True adds greedy)",
            ),
            (
                all(1 <= k <= sampling.n for k in ks),
                f"ks={ks} must all be in [1, n={sampling.n}]; drop the larger k or raise sampling.n",
            ),
            (self.batch_prompts >= 1, f"batch_prompts={self.batch_prompts} must be >= 1"),
            (self.limit is None or self.limit >= 1, f"limit={self.limit} must be >= 1, or None for every prompt"),
            (
                self.style_suite is None or self.style_suite in STYLE_SUITES,
                f"style_suite={self.style_suite!r} has no style function; use one of {STYLE_SUITES} or None",
            ),
            (
                self.style_fn is None or callable(self.style_fn),
                f"style_fn={self.style_fn!r} is not a function (completion, task) -> style name or None",
            ),
            (
                self.style_fn is None or self.style_suite is None,
                f"style_fn and style_suite={self.style_suite!r} both name styles; give one of them",
            ),
        ]
        for ok, message in rules:
            if not ok:
                raise ValueError(f"evaluate: {message}.")
        object.__setattr__(self, "ks", tuple(ks) if ks else tuple(default_ks(sampling.n)))
        if sampling.seed is None:
            object.__setattr__(self, "sampling", replace(sampling, seed=0))


def evaluate_engine(engine: RolloutEngine, env, settings: EvalSettings) -> EvalResult:
    """Evaluates a rollout engine on the tasks of a built verifier env (no file I/O).

    Prompts are encoded with the engine's tokenizer and chat template (as the env runner does)
    and generated ``settings.batch_prompts`` at a time; chunk j is sampled with seed
    ``settings.sampling.seed + j``, then (with ``settings.greedy``) decoded greedily.

    Args:
        engine: A rollout engine (``generate``, ``tokenizer``), e.g. an env runner's.
        env: A verifier env (``rllib_dph.envs.base.VerifierEnv``: ``tasks``, ``reset``, ``step``,
            ``answer_key``, ``solution_style``, ``solution_key``).
        settings: What to sample and report.
    """
    from tqdm.auto import tqdm

    s = settings
    indices = list(range(len(env.tasks) if s.limit is None else min(s.limit, len(env.tasks))))
    params = s.sampling
    greedy_params = SamplingParams(n=1, temperature=0.0, max_new_tokens=params.max_new_tokens)
    start = time.perf_counter()
    records = []
    bar = tqdm(total=len(indices), desc=f"evaluating n={params.n}", unit="prompt",
               disable=None if s.progress else True)  # None: off unless stderr is a terminal
    with bar:
        for _, chunk, sampled in rollout_chunks(engine, env, indices, params, chunk_size=s.batch_prompts):
            greedy = rollout(engine, env, chunk, greedy_params).groups if s.greedy else [None] * len(chunk)
            records += [_record(env, group, greedy_group, s) for group, greedy_group in zip(sampled.groups, greedy)]
            bar.update(len(chunk))
    return EvalResult(
        records=records,
        **{name: getattr(params, name) for name in ("n", "temperature", "top_p", "max_new_tokens", "seed")},
        ks=list(s.ks),
        policy=type(engine).__name__,
        env_id=getattr(env, "name", type(env).__name__),
        duration_s=time.perf_counter() - start,
    )


def _record(env, sampled: ScoredGroup, greedy: Optional[ScoredGroup], settings: EvalSettings) -> PromptRecord:
    """The record of one prompt: its scored samples, their answers, styles and solutions, and its greedy completion."""
    index, texts = sampled.index, sampled.texts
    if settings.style_fn is None:
        styles = [env.solution_style(index, text, settings.style_suite) for text in texts]
    else:
        styles = [_user_style(settings.style_fn, text, env.tasks[index]) for text in texts]
    keep = settings.keep_completions
    return PromptRecord(
        task_id=env.tasks[index].id,
        index=index,
        correct=sampled.correct.tolist(),
        answers=[env.answer_key(index, text) for text in texts],
        styles=[] if None in styles else styles,  # None: the env names no style for this task
        num_truncated=sum(c.finish_reason == "length" for c in sampled.completions),
        greedy_correct=None if greedy is None else bool(greedy.correct[0]),
        completions=texts if keep else None,
        greedy_completion=greedy.texts[0] if keep and greedy is not None else None,
        solutions=[_short_hash(env.solution_key(index, text)) for text in texts],
        turns=sampled.turns.tolist(),
        tool_calls=sampled.tool_calls.tolist(),
        task_fingerprint=env.tasks[index].fingerprint,
    )


def _user_style(style_fn: Callable[[str, Any], Optional[str]], text: str, task) -> str:
    """``style_fn(text, task)`` as a style name (None: ``"none"``); a wrong return type or an
    exception is the function's error, raised with the task and the completion's start."""
    try:
        style = style_fn(text, task)
    except Exception as e:
        raise ValueError(
            f"evaluate: style_fn {_name(style_fn)} raised {type(e).__name__}: {e} on task {task.id}, "
            f"completion {text[:80]!r}; a style function must return a style name or None for any text."
        ) from e
    if style is None:
        return NO_ANSWER_STYLE
    if not isinstance(style, str) or not style:
        raise ValueError(
            f"evaluate: style_fn {_name(style_fn)} returned {style!r} on task {task.id}; return a "
            "non-empty str (the style name) or None (no style)."
        )
    return style


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def load_style_fn(spec: str) -> Callable[[str, Any], Optional[str]]:
    """The style function named ``"module:function"`` (``rllib evaluate --style-fn``).

    Raises:
        ValueError: ``spec`` is not ``module:function``, the module does not import, or it has
            no such function.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"style function {spec!r} is not 'module:function'; e.g. "
            "'rllib_dph.envs.reasoning_gym:countdown_style'."
        )
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"style function {spec!r}: {type(e).__name__}: {e}.") from e
    if not callable(fn):
        raise ValueError(f"style function {spec!r} is a {type(fn).__name__}, not a function.")
    return fn


def _short_hash(key: Optional[str]) -> Optional[str]:
    """A 16-hex-digit SHA-1 prefix of a solution key (None stays None): equal keys, equal hashes,
    and a results file that does not grow with the length of the solutions."""
    return None if key is None else hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def find_module_checkpoint(path: str | os.PathLike) -> Optional[Path]:
    """The learner's RL-module folder of an RLlib Algorithm checkpoint, or None for other folders.

    The folder is returned absolute: RLlib reads checkpoints through pyarrow, which refuses a
    relative path ("URI has empty scheme").

    Args:
        path: A folder written by ``algo.save_to_path`` (or a Tune ``checkpoint_00000N``).

    Raises:
        ValueError: ``path`` is an RLlib checkpoint without a learner RL module, or a Tune trial
            folder (``checkpoint_*`` sub-folders and no model ``config.json``).
    """
    path = Path(path).expanduser().resolve()
    if (path / "rllib_checkpoint.json").is_file():
        from ray.rllib.core import DEFAULT_MODULE_ID

        module_dir = path / RL_MODULE_SUBDIR / DEFAULT_MODULE_ID
        if not module_dir.is_dir():
            raise ValueError(
                f"{path} is an RLlib checkpoint without {RL_MODULE_SUBDIR / DEFAULT_MODULE_ID}; give "
                "the Algorithm checkpoint folder that algo.save_to_path (or Tune) wrote."
            )
        return module_dir
    nested = sorted(path.glob("checkpoint_*"))
    if nested and not (path / "config.json").is_file():  # a model folder has a config.json
        raise ValueError(
            f"{path} is a Tune trial folder, not a checkpoint; give one of its checkpoints, "
            f"e.g. {nested[-1]}."
        )
    return None


def load_engine(
    policy: str | os.PathLike,
    *,
    engine: str = DEFAULT_ENGINE,
    dtype: Optional[str] = None,
    device: str = "cpu",
    engine_kwargs: Optional[Mapping[str, Any]] = None,
) -> RolloutEngine:
    """Builds a rollout engine for a model name, local model folder, HF id or RLlib checkpoint.

    For a checkpoint, the engine is built from the model named in the learner's RL-module config
    (``model_config["model"]``) and then gets the checkpoint's weights (``update_weights``).

    Args:
        policy: Bundled tiny name, ``save_pretrained`` folder, Hugging Face id, or an Algorithm
            checkpoint folder (``algo.save_to_path`` / Tune ``checkpoint_00000N``).
        engine: Engine name, a key of ``rllib_dph.engines.ENGINES``.
        dtype: Weight dtype (``"float32"``, ``"bfloat16"``, ...); None keeps the checkpoint's
            (for an RLlib checkpoint: the learner's compute dtype, ``GRPOConfig.llm(dtype=...)``;
            its float32 master weights are cast to it).
        device: Where to run the engine.
        engine_kwargs: More keyword arguments of the engine's ``from_pretrained``.
    """
    check_engine_name(engine)
    kwargs = {"device": device, **dict(engine_kwargs or {})}
    module_dir = find_module_checkpoint(policy) if Path(policy).expanduser().is_dir() else None
    if module_dir is None:
        return make_engine(engine, str(policy), dtype=dtype, **kwargs)
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str(module_dir))
    model_config = module.model_config
    dtype = dtype or model_config.get("dtype")
    built = make_engine(engine, model_config["model"], dtype=dtype, **kwargs)
    built.update_weights(module.get_state())
    return built


def evaluate_policy(
    policy: str | os.PathLike | RolloutEngine,
    env_id: str,
    env_config: Optional[Mapping[str, Any]] = None,
    settings: Optional[EvalSettings] = None,
    *,
    engine: str = DEFAULT_ENGINE,
    dtype: Optional[str] = None,
    device: str = "cpu",
    engine_kwargs: Optional[Mapping[str, Any]] = None,
    name: str = "",
) -> EvalResult:
    """Evaluates a policy on an env split: n samples (and one greedy completion) per prompt.

    Args:
        policy: A model name / local folder / HF id, an RLlib Algorithm checkpoint folder (see
            :func:`load_engine`), or an already-built rollout engine.
        env_id: Env id (``"rllib_dph/SQL-v0"``), Tune env name or env class.
        env_config: The env's keyword arguments, e.g. ``{"data": "sql_synth/test"}``.
        settings: What to sample and report; None uses the :class:`EvalSettings` defaults.
        engine, dtype, device, engine_kwargs: How to build the engine (:func:`load_engine`);
            unused when ``policy`` is an engine.
        name: Label of the result in plots (default: ``policy``).
    """
    env_config = dict(env_config or {})
    if isinstance(policy, RolloutEngine):
        built, described = policy, type(policy).__name__
    else:
        built = load_engine(policy, engine=engine, dtype=dtype, device=device, engine_kwargs=engine_kwargs)
        described = str(policy)
    env = make_env(env_id, env_config)
    try:
        result = evaluate_engine(built, env, settings or EvalSettings())
    finally:
        env.close()
    result.policy, result.env_id, result.env_config, result.name = described, str(env_id), env_config, name
    return result
