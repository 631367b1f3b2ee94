"""Generation speed of the rollout engines: tokens/s at a few batch sizes, and weight-sync time.

How to run::

    python bench/engines.py                                  # HF engine, tiny and ~100M models
    python bench/engines.py --sizes tiny --batch-sizes 1,16,64,128 --n 8
    python bench/engines.py --model /path/to/saved/model     # any model saved with save_pretrained
    python bench/engines.py --engines hf,hf-compiled         # eager vs compiled decoding (CUDA graphs on a GPU)

    # HF and vLLM side by side: run with a python that has vLLM (on CPU the environment of
    # .ci/vllm, by default ~/.cache/rllib_dph/vllm-venv):
    ~/.cache/rllib_dph/vllm-venv/bin/python bench/engines.py --engines hf,vllm
    # On a CPU shared with other jobs, one thread per engine avoids OpenMP threads waiting on
    # each other (docs/results/costs.md, "Engines and weight sync"):
    ~/.cache/rllib_dph/vllm-venv/bin/python bench/engines.py --engines hf,vllm --threads 1

By default each model is a Qwen2 with random weights, saved to a temporary directory that every
engine loads from. Random weights generate exactly as fast as trained ones, and as these models
have no stop token every row runs for ``--max-new-tokens``. The tiny size is the architecture of
the bundled ``tiny-sql-math`` model. tokens/s counts the generated tokens of one ``generate`` call
(prefill included) over its wall time, measured on the second call of each shape; "1st call" is the
first call's seconds (warm-up; for ``hf-compiled`` also compilation and graph capture). Weight sync
is one ``update_weights`` with the model's full state dict (for vLLM: ``reload_weights`` plus the
prefix-cache reset). Engines run one after the other (all rows of the first engine, then the next),
so that vLLM's in-process thread binding cannot slow down the rows of another engine. Another
engine adds rows by adding a builder to ``ENGINES``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.utils import logging as hf_logging

from rllib_dph.engines.base import SamplingParams
from rllib_dph.engines.hf import HFEngine

# Architectures with random weights, by name: (HF family, config fields). "tiny" is the bundled
# tiny-sql-math's shape; the others are public config.json shapes (SmolLM2-135M is a Llama).
SIZES = {
    "tiny": ("qwen2", dict(
        vocab_size=2048, hidden_size=192, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4,
    )),
    "100m": ("qwen2", dict(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4,
    )),
    "smollm2-135m": ("llama", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0,
    )),
    "qwen2-0.5b": ("qwen2", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2,
    )),
    "qwen2-1.5b": ("qwen2", dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2,
    )),
}


def save_random_model(size: str, directory: Path, dtype: torch.dtype = torch.float32) -> Path:
    """Saves a random-weight model of ``SIZES[size]`` in ``dtype`` and a word-level tokenizer
    without EOS. The weights are drawn on the GPU when there is one (a 1.5B model's
    initialisation takes tens of seconds on a CPU)."""
    family, arch = SIZES[size]
    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[family]
    config = config_class(**arch, max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class(config)
    model.to(dtype).save_pretrained(directory)
    del model
    vocab = {f"w{i}": i for i in range(arch["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)
    return directory


def hf_engine(path: Path, *, dtype: str, device: str, max_batch_size: int, compile_decode: bool = False) -> HFEngine:
    """The HF ``transformers`` engine on a saved model (eager decoding unless ``compile_decode``)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    return HFEngine(model, tokenizer, device=device, max_batch_size=max_batch_size, compile_decode=compile_decode)


def hf_compiled_engine(path: Path, **kwargs) -> HFEngine:
    """The HF engine with its compiled decoder (static KV cache; CUDA graphs on a GPU)."""
    return hf_engine(path, compile_decode=True, **kwargs)


def vllm_engine(path: Path, *, dtype: str, device: str, max_batch_size: int):
    """The vLLM engine (in-process) on a saved model; ``max_batch_size`` caps its running rows."""
    from rllib_dph.engines.vllm import VLLMEngine

    return VLLMEngine.from_pretrained(
        str(path), dtype=dtype, device=device, max_num_seqs=max_batch_size
    )


# Engine name → builder(path, *, dtype, device, max_batch_size) -> RolloutEngine.
ENGINES = {"hf": hf_engine, "hf-compiled": hf_compiled_engine, "vllm": vllm_engine}


def measure(engine, *, rows: int, n: int, prompt_len: int, max_new_tokens: int, vocab_size: int):
    """Generated tokens/s and seconds of one ``generate`` call with ``rows`` = prompts × n rows."""
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab_size, (max(1, rows // n), prompt_len), generator=generator)
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new_tokens, seed=0)
    start = time.perf_counter()
    groups = engine.generate(prompts.tolist(), params)
    seconds = time.perf_counter() - start
    num_tokens = sum(len(c.token_ids) for group in groups for c in group)
    return num_tokens / seconds, seconds


def weight_sync_ms(engine, state: dict[str, torch.Tensor], repeats: int = 5) -> float:
    """Median milliseconds of one ``update_weights`` with a full state dict (CPU tensors)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.update_weights(state)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf", help=f"comma-separated, of {sorted(ENGINES)}")
    parser.add_argument("--sizes", default="tiny,100m", help=f"comma-separated, of {sorted(SIZES)}")
    parser.add_argument("--model", default=None, help="a saved model directory instead of --sizes")
    parser.add_argument("--batch-sizes", default="1,8,32,128", help="rows per generate call")
    parser.add_argument("--n", type=int, default=1, help="completions per prompt (rows share a prompt)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="CPU threads: torch's, and vLLM's OpenMP threads (bound to cores 0..N-1)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    hf_logging.disable_progress_bar()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    print(f"device={args.device} dtype={args.dtype} torch threads={torch.get_num_threads()} "
          f"prompt={args.prompt_len} new tokens={args.max_new_tokens} n={args.n}")
    header = (f"{'engine':<11} {'model':<10} {'params':>7} {'rows':>5} {'tokens/s':>9} {'s/call':>7} "
              f"{'1st call':>8}")
    print(header + "\n" + "-" * len(header))
    syncs = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            models_to_run = [(Path(args.model).name, Path(args.model))]
        else:
            models_to_run = [
                (size, save_random_model(size, Path(tmp) / size)) for size in args.sizes.split(",")
            ]
        # The learner's view of each model: size, vocabulary and the state dict a sync sends.
        references = {}
        for model_name, path in models_to_run:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype))
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            references[model_name] = (model.num_parameters() / 1e6, model.config.vocab_size, state)
            del model
        for engine_name in args.engines.split(","):
            for model_name, path in models_to_run:
                num_params, vocab_size, state = references[model_name]
                engine = ENGINES[engine_name](
                    path, dtype=args.dtype, device=args.device, max_batch_size=max(batch_sizes)
                )
                kwargs = dict(n=args.n, prompt_len=args.prompt_len, vocab_size=vocab_size)
                for rows in batch_sizes:
                    # The first call of a shape pays warm-up (and hf-compiled's compilation and
                    # CUDA-graph capture); the second is the steady state.
                    _, first = measure(engine, rows=rows, max_new_tokens=args.max_new_tokens, **kwargs)
                    tokens_per_s, seconds = measure(
                        engine, rows=rows, max_new_tokens=args.max_new_tokens, **kwargs
                    )
                    print(f"{engine_name:<11} {model_name:<10} {num_params:>6.1f}M {rows:>5} "
                          f"{tokens_per_s:>9.0f} {seconds:>7.2f} {first:>8.2f}", flush=True)
                syncs.append((engine_name, model_name, weight_sync_ms(engine, state)))
                del engine
                gc.collect()
    print("\nweight sync (update_weights with the full state dict)")
    for engine_name, model_name, ms in syncs:
        print(f"{engine_name:<11} {model_name:<10} {ms:>8.1f} ms")


if __name__ == "__main__":
    main()
