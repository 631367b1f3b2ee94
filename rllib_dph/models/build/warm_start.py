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
answer; or the answer at once), the loss on the policy turns only.

``model_name="smollm2-135m-sft"`` (or the 5x longer ``"smollm2-135m-sft-600"``, or either with the
NULL family in its pool: ``"smollm2-135m-sft-nulls"``, ``"smollm2-135m-sft-600-nulls"``) is built
into the model cache by the run's preparation step (``build.prepare``; or ahead of time:
``rllib build-model smollm2-135m-sft``), with a progress bar; an interrupted build resumes from its last checkpoint (every ``checkpoint_every``
steps). The folder's build record holds the spec, the base model's fingerprint, the loss curve's
ends and the folder's own fingerprint; a changed spec, base model or SFT corpus (the suites'
solutions change when the suites do) makes it rebuild.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
import numpy as np
import torch

from rllib_dph.models.build.sft import encode_example, sft
from rllib_dph.models.build.tiny import corpus_fingerprint
from rllib_dph.models.catalog import (
    BUILD_RECORD,
    WARM_START_VERSION,
    WARM_STARTS,
    WarmStartSpec,
    pinned_corpus,
    recorded_fingerprint,
)
from rllib_dph.models.folders import folder_fingerprint, load_model_folder, load_tokenizer_folder

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
        "base_fingerprint": recorded_fingerprint(base_dir),
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
            "(catalog.CORPORA): the suites changed under its recipe; pin the new sha256 there."
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
