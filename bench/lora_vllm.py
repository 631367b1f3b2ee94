"""LoRA in the vLLM engine: adapter sync (vLLM's LoRA serving) against merge-and-load, on CPU.

Run with the vLLM environment's python (``.ci/vllm`` makes it)::

    ~/.cache/rllib_dph/vllm-venv/bin/python bench/lora_vllm.py --model smollm2-135m-instruct --rank 16

One LoRA policy (random B, so the adapters change the outputs) on ``--model`` in fp32; the same
prompts are decoded ``--repeats`` times after each of two kinds of weight sync:

- **adapters**: the adapter state into an engine started with ``lora=`` (``VLLMEngine.load_adapters``:
  a PEFT folder and a new ``LoRARequest``; vLLM loads it on the next ``generate``);
- **merge-and-load**: ``lora.merged_state`` (W + (alpha/r)·B·A, every weight) into a plain
  engine with a full ``update_weights`` (``reload_weights``).

Printed per mode: the bytes a sync moves, the sync call, the first decode after it (which loads
the adapter), the median of the later decodes, and generated tokens/s. The base engine's decode
(no adapters) is printed as a reference. docs/lora.md has a run.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _policy(model: str, rank: int):
    import torch

    from rllib_dph.policy import lora
    from rllib_dph.models.hub import load_causal_lm

    settings = lora.lora_settings({"r": rank, "alpha": 2 * rank})
    policy = lora.add_adapters(load_causal_lm(model, dtype=torch.float32), settings)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if lora.is_adapter_key(name):
                param.copy_(0.02 * torch.randn(param.shape, generator=generator))
    return policy, settings


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _decodes(engine, prompts, params, repeats: int) -> tuple[float, float, int]:
    """(first decode s, median of the later ones s, tokens per decode)."""
    outputs = []
    times = [_timed(lambda: outputs.append(engine.generate(prompts, params))) for _ in range(repeats)]
    tokens = sum(len(c.token_ids) for group in outputs[-1] for c in group)
    return times[0], statistics.median(times[1:]), tokens


def _bytes(state) -> int:
    import torch

    return sum(torch.as_tensor(v).numel() * torch.as_tensor(v).element_size() for v in state.values() if not isinstance(v, dict))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-sql-math")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    from rllib_dph.policy import lora
    from rllib_dph.chat import encode_prompt
    from rllib_dph.engines import SamplingParams, make_engine
    from rllib_dph.models.build.prepare import prepare_model
    from rllib_dph.models.hub import load_tokenizer

    prepare_model(args.model)  # a bundled model not built yet is built first (one line on stderr)
    tokenizer = load_tokenizer(args.model)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": f"List the names of the singers older than {20 + i}."}])
               for i in range(args.prompts)]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    policy, settings = _policy(args.model, args.rank)
    adapters, merged = lora.adapter_state(policy, settings), lora.merged_state(policy)
    kwargs = {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 512 << 20}

    rows = []
    for mode in ("base", "adapters", "merge-and-load"):
        start = time.perf_counter()
        engine = make_engine("vllm", args.model, lora=settings if mode == "adapters" else None, **kwargs)
        started = time.perf_counter() - start
        state = {"adapters": adapters, "merge-and-load": merged}.get(mode)
        sync = _timed(lambda: engine.update_weights(state)) if state is not None else 0.0
        first, later, tokens = _decodes(engine, prompts, params, args.repeats)
        rows.append((mode, _bytes(state) if state else 0, started, sync, first, later, tokens / later))
        del engine
        gc.collect()

    print(f"\n{args.model}, LoRA r={args.rank} all-linear, fp32, {args.prompts} prompts x n={args.n} x "
          f"{args.new_tokens} tokens, {os.cpu_count()} CPUs")
    print("| mode | bytes per sync | engine start s | sync call s | first decode s | later decodes s (median) | tokens/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode, size, started, sync, first, later, rate in rows:
        print(f"| {mode} | {size / 1e6:.1f} MB | {started:.1f} | {sync:.3f} | {first:.2f} | {later:.2f} | {rate:.0f} |")


if __name__ == "__main__":
    main()
