"""Tiny offline base models: a local tokenizer, a small Qwen2 causal LM and its SFT.

Everything here runs on a laptop CPU with no download. ``build_tiny_model`` trains a byte-level
BPE tokenizer on the bundled suites (``rllib_dph.envs.suites``), builds a small ``Qwen2ForCausalLM`` from a
seed, supervised-fine-tunes it on the suites' multi-style SQL and math solutions and saves
everything with ``save_pretrained``; the build command adds the base policy's measured quality
(``rllib_dph.evaluation.base_model``) to the build record. The schedule of
``tiny-sql-math`` is tuned so that the base policy is *competent but imperfect and diverse*: it
solves part of the SQL test split greedily, solves clearly more with 8 samples, and samples every
SQL solution style — the starting point the DPH-RL experiments need. ``tiny-random`` has the same
tokenizer and architecture with untrained weights, for fast tests.

Usage::

    rllib build-model tiny-sql-math --force   # with the quality check; a run's preparation step builds one without
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

from rllib_dph.envs import suites
from rllib_dph.models.build.sft import encode_example, sft
from rllib_dph.models.catalog import BUILD_RECORD, TINY_BUILD_VERSION, TINY_MODELS, TinyModelSpec

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
#: Special tokens, in id order (0, 1, 2).
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)
#: Qwen-style chat template: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: Torch threads of a build. One thread: the same weights on every machine with the same CPU
#: kernels, whatever its core count, and robust on a busy machine: a second thread makes an
#: idle build faster but one that shares the CPU with other jobs much slower (threads wait for
#: each other at every parallel region; measured: docs/models.md, "Build threads, and why the model ships"); pass
#: ``num_threads`` to choose.
BUILD_THREADS = 1
#: The suites the tiny models are trained on.
SUITES = ("sql_synth", "math_synth")


def sft_corpus(extra_splits: Sequence[str] = ()) -> list[dict]:
    """The SFT examples of every suite's train split, then of ``extra_splits``, in a fixed order.

    Returns:
        Dicts with ``messages`` (the prompt as chat messages), ``completion``, ``style`` and
        ``task_id`` (see ``rllib_dph.envs.suites.sft_examples``).
    """
    examples = []
    for split in (*(f"{suite}/train" for suite in SUITES), *extra_splits):
        examples.extend(suites.sft_examples(split))
    return examples


def corpus_fingerprint(examples: Sequence[dict]) -> str:
    """sha256 of the SFT examples (JSON, sorted keys): which data a build was trained on."""
    return hashlib.sha256(json.dumps(list(examples), sort_keys=True).encode()).hexdigest()


def corpus_texts(examples: Sequence[dict]) -> list[str]:
    """The tokenizer's training texts: each chat turn as ``role\ncontent``, so role names get tokens too."""
    texts = []
    for ex in examples:
        texts.extend(f"{m['role']}\n{m['content']}" for m in ex["messages"])
        texts.append(f"assistant\n{ex['completion']}")
    return texts


def train_tokenizer(texts: Sequence[str], vocab_size: int, *, model_max_length: int = 1024) -> Qwen2Tokenizer:
    """Trains a byte-level BPE tokenizer with Qwen2's pre-tokenization, special tokens and chat template.

    The BPE uses exactly the normalizer and pre-tokenizer of ``Qwen2Tokenizer`` (NFC, Qwen's split
    regex with single digits, byte level), and the result is a ``Qwen2Tokenizer``: that is the
    class ``AutoTokenizer`` picks for a ``qwen2`` model directory, and it rebuilds its pipeline from
    the vocabulary and merges, so the tokenizer saved with the model loads back unchanged.
    Training is deterministic: the same texts in the same order give the same vocabulary.

    Args:
        texts: Training texts (prompts and completions).
        vocab_size: Upper bound of the vocabulary size, special tokens included (>= 259: 256
            bytes + 3); the BPE stops earlier when the texts offer no more merges.
        model_max_length: Longest sequence the model takes (recorded in the tokenizer config).

    Returns:
        A fast tokenizer with ``<|endoftext|>`` as pad token (id 0), ``<|im_start|>`` (id 1) and
        ``<|im_end|>`` as EOS token (id 2).
    """
    min_size = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs at least {min_size} "
            f"entries (256 bytes + {len(SPECIAL_TOKENS)} special tokens); use e.g. 2048."
        )
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    trained = json.loads(bpe.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(pair) for pair in trained["merges"]],
        unk_token=None,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM with tied embeddings, seeded by ``spec.seed``.

    Args:
        tokenizer: Tokenizer from :func:`train_tokenizer`; fixes the vocabulary and special ids.
        spec: Architecture and seed.
    """
    if spec.hidden_size % spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise ValueError(
            f"hidden_size={spec.hidden_size}, num_heads={spec.num_heads}, "
            f"num_kv_heads={spec.num_kv_heads}: hidden_size must be divisible by num_heads and "
            "num_heads by num_kv_heads; pick e.g. 128, 4, 4."
        )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return model


def build_tiny_model(
    name: str, out_dir: str | os.PathLike, *, num_threads: int = BUILD_THREADS, progress: bool = True,
    evaluate: Optional[Callable[..., dict]] = None,
) -> dict:
    """Builds the bundled tiny model ``name`` into ``out_dir`` and returns its build record.

    Trains the tokenizer, initialises the model and runs SFT as ``TINY_MODELS[name]`` says, then
    the quality check ``evaluate`` if given, and writes ``save_pretrained`` files plus
    ``rllib_dph_build.json`` (the spec, the SFT loss curve summary, the measured metrics and
    timings). The weights are deterministic for a given machine and thread count, with or
    without the quality check (it runs after SFT).

    Args:
        name: A key of :data:`TINY_MODELS`.
        out_dir: Directory to write into (created; existing files are overwritten).
        num_threads: Torch threads for the build (default :data:`BUILD_THREADS`).
        progress: Show progress bars.
        evaluate: The quality check (``evaluation.base_model.evaluate_base_policy``, passed by the
            build command), called with the spec's evaluation settings; None records no metrics.
    """
    if name not in TINY_MODELS:
        raise KeyError(f"unknown tiny model {name!r}; the bundled ones are {sorted(TINY_MODELS)}.")
    spec = TINY_MODELS[name]
    out_dir = Path(out_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        start = time.perf_counter()
        examples = sft_corpus(spec.extra_sft_splits)
        tokenizer = train_tokenizer(
            corpus_texts(examples), spec.vocab_size, model_max_length=spec.max_position_embeddings
        )
        model = build_model(tokenizer, spec)
        record = {
            "name": name,
            "build_version": TINY_BUILD_VERSION,
            "spec": json.loads(json.dumps(asdict(spec))),
            "corpus_sha256": corpus_fingerprint(examples),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "num_threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
        }
        if spec.sft_steps > 0:
            record["sft"] = _run_sft(model, tokenizer, examples, spec, progress)
        model.eval()
        if evaluate is not None and spec.eval_samples > 0:
            eval_start = time.perf_counter()
            record["metrics"] = evaluate(
                model, tokenizer, samples=spec.eval_samples, max_new_tokens=spec.eval_max_new_tokens,
                seed=spec.seed, progress=progress,
            )
            record["eval_seconds"] = round(time.perf_counter() - eval_start, 1)
        record["build_seconds"] = round(time.perf_counter() - start, 1)
    finally:
        torch.set_num_threads(threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    (out_dir / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def _run_sft(model, tokenizer, examples: Sequence[dict], spec: TinyModelSpec, progress: bool) -> dict:
    """Supervised fine-tuning of the fresh model on the corpus; returns the record's ``sft`` entry."""
    encoded = [encode_example(tokenizer, ex["messages"], ex["completion"]) for ex in examples]
    too_long = max(len(ids) for ids, _ in encoded)
    if too_long > spec.max_position_embeddings:
        raise ValueError(
            f"an SFT example has {too_long} tokens, more than max_position_embeddings="
            f"{spec.max_position_embeddings}; raise max_position_embeddings in the spec."
        )
    start = time.perf_counter()
    losses = sft(model, encoded, spec, pad_id=tokenizer.pad_token_id, progress=progress)
    return {
        "examples": len(encoded),
        "epochs": round(spec.sft_steps * spec.batch_size / len(encoded), 2),
        "first_loss": losses[0],
        "final_loss": float(np.mean(losses[-20:])),
        "seconds": round(time.perf_counter() - start, 1),
    }


def format_record(record: dict) -> str:
    """A short human-readable summary of a build record."""
    size = record["num_parameters"] / 1e6
    lines = [f"{record['name']}: {size:.2f}M parameters, built in {record['build_seconds']}s"]
    if "sft" in record:
        s = record["sft"]
        epochs = f", {s['epochs']} epochs" if "epochs" in s else ""
        lines.append(
            f"  SFT: {s['examples']} examples{epochs}, loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}"
            + (f" in {s['seconds']}s" if "seconds" in s else "")
        )
        if "styles" in s:
            lines.append("  styles: " + ", ".join(f"{k} {v}" for k, v in s["styles"].items()))
    for key, value in record.get("metrics", {}).items():
        lines.append(f"  {key:32s} {value:.3f}" if isinstance(value, float) else f"  {key:32s} {value}")
    return "\n".join(lines)
