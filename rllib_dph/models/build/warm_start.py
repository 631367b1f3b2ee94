"""Warm starts: a short SFT of a pretrained chat model on the suites' multi-style solutions.

SmolLM2-135M-Instruct solves none of the bundled suites zero-shot (it rewrites the schema and
runs past the token limit), so RL on them would have no reward to start from. The DPH-RL paper
made its multi-style base policy the same way (Appendix B): supervised fine-tuning on several
correct solution styles per question, so that the base model samples all of them and pass@k is
well above greedy. A warm start here is the base model fine-tuned on a seeded sample of the
train splits' solutions (every SQL style in equal numbers: plain, alias, subquery, CTE, negated;
the math suite's worked answers), through the model's own chat template, with the loss on the
completion and its end-of-turn token.

``tiny-sql-math-mt`` is the bundled ``tiny-sql-math`` taught the multi-turn protocol of
``rllib_dph/SQLMultiTurn-v0`` the same way: half of its SQL examples are replayed as the env's
episodes (``rllib_dph.envs.sql.multiturn.sft_traces``: an exploratory query, the env's reply, the
answer; or the answer at once), the loss on the policy turns only (issue #26, item 6).

``model_name="smollm2-135m-sft"`` (or the 5x longer ``"smollm2-135m-sft-600"``, or either with the
NULL family in its pool: ``"smollm2-135m-sft-nulls"``, ``"smollm2-135m-sft-600-nulls"``) builds it on
first use into the model cache (or ahead of time: ``rllib build-model smollm2-135m-sft``), with a
progress bar; an interrupted build resumes from its last checkpoint (every ``checkpoint_every``
steps). The folder's build record holds the spec, the base model's fingerprint, the loss curve's
ends and the folder's own fingerprint; a changed spec, base model or SFT corpus (the suites'
solutions change when the suites do) makes it rebuild.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from rllib_dph.envs.countdown import TINY_COUNTDOWN, CountdownSFT
from rllib_dph.models.folders import folder_fingerprint, load_model_folder, load_tokenizer_folder
from rllib_dph.models.build.sft import encode_example, sft
from rllib_dph.models.build.tiny import corpus_fingerprint

#: Version of the warm-start recipe; a build made by another version is rebuilt.
WARM_START_VERSION = 1
#: File of the build record inside a model folder (as for every bundled model).
BUILD_RECORD = "rllib_dph_build.json"


@dataclass(frozen=True)
class WarmStartSpec:
    """One warm start.

    Args:
        base: The pretrained chat model (a bundled name, folder or HF id).
        splits: Suite splits whose solutions are the SFT data (``rllib_dph.envs.suites.sft_examples``).
        sft_steps: Optimizer steps; ``sft_steps * batch_size`` examples are drawn (seeded) from
            the splits, each seen once.
        batch_size: Sequences per step.
        lr: Peak AdamW learning rate (linear warm-up, cosine decay to ``min_lr_ratio``).
        warmup_steps: Warm-up steps.
        min_lr_ratio: Final learning rate as a fraction of ``lr``.
        weight_decay: AdamW weight decay on matrices.
        grad_clip: Maximum global gradient norm.
        seed: Seed of the example draw and the batch order.
        checkpoint_every: Steps between resumable checkpoints.
        multi_turn_share: Share of the drawn ``sql_synth`` examples replayed as
            ``SQLMultiTurn-v0`` episodes (``rllib_dph.envs.sql.multiturn.sft_traces``, seeded with ``seed``)
            instead of single-turn ``SQL-v0`` answers; 0.0: single-turn examples only.
        countdown: reasoning-gym countdown puzzles whose solver-written solutions of several
            shapes join the pool (``rllib_dph.envs.countdown.sft_examples``); None: none.
    """

    base: str
    splits: tuple[str, ...] = ("sql_synth/train", "math_synth/train")
    sft_steps: int = 120
    batch_size: int = 8
    lr: float = 1e-4
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 20
    multi_turn_share: float = 0.0
    countdown: Optional[CountdownSFT] = None


#: The default SFT splits with the NULL family's ordinary questions added (its ``*-nulls`` warm starts).
NULL_FAMILY_POOL = (*WarmStartSpec.splits, "sql_synth/train_nulls")

#: The warm starts by model name.
WARM_STARTS: dict[str, WarmStartSpec] = {
    "smollm2-135m-sft": WarmStartSpec(base="smollm2-135m-instruct"),
    # The same recipe 5x longer (4,800 examples): SmolLM2 learns the ties family's minority
    # approach (`= (SELECT MAX(...))`, 15 % of the corpus's highest/lowest answers, as in the
    # 120-step one) only from the longer run; measured shares in docs/models.md.
    "smollm2-135m-sft-600": WarmStartSpec(base="smollm2-135m-instruct", sft_steps=600),
    # The 120-step recipe with the NULL family's ordinary questions added to the pool (as
    # tiny-sql-math-nulls adds them to the tiny recipe): 20 % of their answers `COUNT(col)`
    # (suites.NULL_SFT_SHARE), the robust approach of sql_synth/test_nulls (docs/collapse.md).
    "smollm2-135m-sft-nulls": WarmStartSpec(base="smollm2-135m-instruct", splits=NULL_FAMILY_POOL),
    # And 5x longer, as smollm2-135m-sft-600 is the 120-step recipe: a base model that solves most
    # training prompts 8 of 8, so that D_pef holds more than a few of them.
    "smollm2-135m-sft-600-nulls": WarmStartSpec(base="smollm2-135m-instruct", splits=NULL_FAMILY_POOL, sft_steps=600),
    # The bundled tiny model taught reasoning-gym's countdown (TINY_COUNTDOWN: 3 numbers of 1-20,
    # targets 1-100) on up to 8 solver-written solutions of different shapes per puzzle of the
    # 2,000 train puzzles (8,968 rows, each seen once), so that it solves some puzzles in several
    # ways (docs/results/countdown.md). Built on first use, not shipped.
    "tiny-countdown": WarmStartSpec(
        base="tiny-sql-math", splits=(), countdown=TINY_COUNTDOWN,
        sft_steps=560, batch_size=16, lr=2e-3, warmup_steps=20, checkpoint_every=100,
    ),
    "tiny-sql-math-mt": WarmStartSpec(
        base="tiny-sql-math", splits=("sql_synth/train",), sft_steps=800, batch_size=16, lr=2e-3,
        warmup_steps=20, checkpoint_every=200, multi_turn_share=0.5,
    ),
}


def _base_fingerprint(base_dir: str | os.PathLike) -> str:
    """The base model folder's fingerprint: from its build record when it has one (cheap), else hashed."""
    record = Path(base_dir) / BUILD_RECORD
    if record.is_file():
        fingerprint = json.loads(record.read_text()).get("fingerprint")
        if fingerprint:
            return fingerprint
    return folder_fingerprint(base_dir)


def training_examples(spec: WarmStartSpec) -> list[dict]:
    """The ``sft_steps * batch_size`` examples of the warm start, drawn with ``spec.seed``."""
    from rllib_dph.envs import suites

    pool = [ex for split in spec.splits for ex in suites.sft_examples(split)]
    if spec.countdown is not None:
        from rllib_dph.envs.countdown import sft_examples as countdown_examples

        pool += countdown_examples(spec.countdown)
    wanted = spec.sft_steps * spec.batch_size
    if wanted > len(pool):
        raise ValueError(
            f"sft_steps * batch_size = {wanted} examples, but the splits {list(spec.splits)} hold "
            f"{len(pool)}; lower sft_steps or batch_size."
        )
    order = np.random.default_rng(spec.seed).permutation(len(pool))[:wanted]
    chosen = [pool[i] for i in order]
    return _with_traces(chosen, spec) if spec.multi_turn_share > 0 else chosen


def _with_traces(examples: list[dict], spec: WarmStartSpec) -> list[dict]:
    """``examples`` with a seeded ``spec.multi_turn_share`` of the ``sql_synth`` ones replaced by
    their ``SQLMultiTurn-v0`` traces (``rllib_dph.envs.sql.multiturn.sft_traces``), in place of the same rows."""
    from rllib_dph.envs.sql.multiturn import sft_traces
    from rllib_dph.envs.suites import SQL_SUITE

    rng = np.random.default_rng(spec.seed + 1)
    by_split: dict[str, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        if ex["task_id"].startswith(f"{SQL_SUITE}/") and rng.random() < spec.multi_turn_share:
            by_split[ex["task_id"].rsplit("/", 1)[0]].append(i)
    out = list(examples)
    for split, rows in by_split.items():
        for i, trace in zip(rows, sft_traces(split, [examples[i] for i in rows], seed=spec.seed)):
            out[i] = trace
    return out


#: The spec fields that decide a warm start's SFT examples (:func:`training_examples`).
CORPUS_FIELDS = ("splits", "sft_steps", "batch_size", "seed", "multi_turn_share", "countdown")

#: The SFT corpus of each named warm start, pinned: ``name: (recipe, sha256)``, the fingerprint
#: of its recipe (:func:`corpus_recipe`) and the sha256 of the examples that recipe makes
#: (:func:`training_examples`, ``tiny.corpus_fingerprint``). A build is current only when its
#: record holds its recipe's pinned sha256, so the check reads no corpus. ``tests/test_warm_start.py``
#: remakes every pinned corpus: when the suites change under a pin it fails naming the new
#: sha256 to pin here, and cached builds of the old corpus are then rebuilt.
CORPORA: dict[str, tuple[str, str]] = {
    "smollm2-135m-sft": ("260e5a9cda82e463", "74e462f0c261ac59417524f0ef5e75c3b74f3903aecda01ae65fb259270b20e3"),
    "smollm2-135m-sft-600": ("88f546f9ae0a68b5", "572d1e4f3f75b4cf8922584a7002b2dd42eb3735af89dfcb7db2337ba7e34363"),
    "smollm2-135m-sft-nulls": ("97cf16e9a28c5c68", "f99ebc94ae1da08fb066c0dc81af35244c1ae74b3e0cf3971d465af66679b249"),
    "smollm2-135m-sft-600-nulls": ("51146412f3d78496", "618d0444c5a71931e0c3052136488872aacf619f5c620525bfa11e524d2863b1"),
    "tiny-countdown": ("8672864eeed2b471", "cc9b01956b3a20dd996ec188b3d1801c9b17dac561c945f9e8712de7cf024fab"),
    "tiny-sql-math-mt": ("9fd110fd0dd83777", "bc86aba6bc7957347617d896c68b2ae778f4c4d8c932b526bb164731ba77b28d"),
}


def corpus_recipe(spec: WarmStartSpec) -> str:
    """16 hex characters over the fields of ``spec`` that decide its SFT examples (:data:`CORPUS_FIELDS`)."""
    recipe = {name: value for name, value in asdict(spec).items() if name in CORPUS_FIELDS}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def pinned_corpus(spec: WarmStartSpec) -> Optional[str]:
    """The pinned sha256 of ``spec``'s SFT examples (:data:`CORPORA`); None for a recipe without
    a pin (a spec of one's own, whose corpus is then not checked)."""
    recipe = corpus_recipe(spec)
    return next((sha256 for pinned_recipe, sha256 in CORPORA.values() if pinned_recipe == recipe), None)


def build_warm_start(
    name: str,
    out_dir: str | os.PathLike,
    *,
    base_dir: str | os.PathLike,
    checkpoint_dir: str | os.PathLike | None = None,
    num_threads: int | None = None,
    progress: bool = True,
    device: str | None = None,
) -> dict:
    """Fine-tunes ``WARM_STARTS[name]``'s base model and saves it into ``out_dir``.

    Args:
        name: A key of :data:`WARM_STARTS`.
        out_dir: Directory to write into (created).
        base_dir: The folder of the spec's base model (``hub.resolve_model(spec.base)``).
        checkpoint_dir: Where the resumable SFT state lives (kept across interrupted builds,
            removed after a complete one); None: no checkpoints.
        num_threads: Torch threads for the build (default: torch's current setting).
        progress: Show progress bars.
        device: Where the SFT runs (fp32 either way); None: the first CUDA device when there is
            one, else the CPU. The record names it: a GPU build's weights differ from a CPU
            build's by floating-point rounding, not by recipe.

    Returns:
        The build record (also written to ``out_dir/rllib_dph_build.json``).
    """
    spec = WARM_STARTS[name]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        start = time.perf_counter()
        tokenizer = load_tokenizer_folder(str(base_dir))
        model = load_model_folder(str(base_dir), dtype=torch.float32).to(device)
        examples = _pinned_examples(name, spec)
        encoded = [encode_example(tokenizer, ex["messages"], ex["completion"]) for ex in examples]
        sft_start = time.perf_counter()
        losses = sft(
            model, encoded, spec, pad_id=tokenizer.pad_token_id, progress=progress,
            checkpoint_dir=checkpoint_dir, checkpoint_every=spec.checkpoint_every,
        )
        sft_seconds = round(time.perf_counter() - sft_start, 1)
    finally:
        torch.set_num_threads(threads)
    record = {
        "name": name,
        "warm_start_version": WARM_START_VERSION,
        "spec": asdict(spec),
        "base_fingerprint": _base_fingerprint(base_dir),
        "corpus_sha256": corpus_fingerprint(examples),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "sft": _sft_summary(examples, losses, sft_seconds),
        "device": torch.device(device).type,
    }
    return _save(record, model, tokenizer, Path(out_dir), checkpoint_dir, start)


def _pinned_examples(name: str, spec: WarmStartSpec) -> list[dict]:
    """:func:`training_examples` of ``spec``, refused when they are not its pinned corpus (a build
    of them would never be current)."""
    examples = training_examples(spec)
    pinned, made = pinned_corpus(spec), corpus_fingerprint(examples)
    if pinned is not None and made != pinned:
        raise ValueError(
            f"warm start {name!r}: its SFT examples have sha256 {made}, not the pinned {pinned} "
            "(warm_start.CORPORA): the suites changed under its recipe; pin the new sha256 there."
        )
    return examples


def _save(record: dict, model, tokenizer, out_dir: Path, checkpoint_dir: str | os.PathLike | None, start: float) -> dict:
    """Saves the model and tokenizer into ``out_dir``, adds the folder's fingerprint and the build
    time to ``record``, writes it there and removes the resumable SFT state of a complete build."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    record["fingerprint"] = folder_fingerprint(out_dir)
    record["build_seconds"] = round(time.perf_counter() - start, 1)
    (out_dir / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if checkpoint_dir is not None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    return record


def _sft_summary(examples: list[dict], losses: list[float], seconds: float) -> dict:
    """The ``sft`` part of a build record.

    Args:
        examples: The training examples (``training_examples``), each with its ``style``.
        losses: The loss of every SFT step.
        seconds: SFT time of this run (a resumed build counts only its own part).
    """
    styles = Counter(ex["style"] for ex in examples)
    traces = Counter(ex["probe"] or "direct" for ex in examples if "probe" in ex)
    return {
        "examples": len(examples),
        "styles": dict(sorted(styles.items())),
        "multi_turn": dict(sorted(traces.items())),
        "first_loss": losses[0],
        "final_loss": float(np.mean(losses[-10:])),
        "seconds": seconds,
    }


def is_current_warm_start(path: str | os.PathLike, name: str, base_dir: str | os.PathLike | None) -> bool:
    """Whether ``path`` holds a complete build of warm start ``name`` by this recipe and spec, of
    its pinned SFT corpus (:data:`CORPORA`) and of its base model (``base_dir``: the base's
    folder; None when it is not on disk, then it is not checked). Reads the build records only."""
    record_path = Path(path) / BUILD_RECORD
    if not record_path.is_file():
        return False
    record = json.loads(record_path.read_text())
    spec = WARM_STARTS[name]
    if record.get("warm_start_version") != WARM_START_VERSION or _recorded_spec(record.get("spec", {}), spec) != _as_json(spec):
        return False
    pinned = pinned_corpus(spec)
    if pinned is not None and record.get("corpus_sha256") != pinned:
        return False
    if base_dir is None:
        return True
    try:
        return record.get("base_fingerprint") == _base_fingerprint(base_dir)
    except (FileNotFoundError, OSError):
        return True


def _as_json(value) -> dict:
    """A spec as a build record stores it (JSON types: a tuple is a list)."""
    return json.loads(json.dumps(asdict(value)))


def _recorded_spec(recorded: dict, spec) -> dict:
    """A recorded spec with the defaults of the fields it lacks, in ``spec`` and in the
    dataclasses inside it: a field added after that build has the default that build did."""
    filled = dict(recorded)
    for field in fields(spec):
        value = getattr(spec, field.name)
        if field.name not in filled and field.default is not MISSING:
            filled[field.name] = field.default
        elif is_dataclass(value) and isinstance(filled.get(field.name), dict):
            filled[field.name] = _recorded_spec(filled[field.name], value)
    return json.loads(json.dumps(filled, default=lambda v: asdict(v) if is_dataclass(v) else str(v)))
