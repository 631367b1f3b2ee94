"""Where a decoding step of the HF engine spends its time, eager against compiled (issue #28).

The H200 suite measured eager decoding at 18-26 ms per step whatever the model's size and the
compiled decoder (``compile_decode``) at 5-10 ms, 2.7-5.1x, short of the 10x that would make it
the CUDA default. This script profiles one ``generate`` call of each path with
``torch.profiler`` (CPU and CUDA activity) after a warm-up call of the same shape, and reports
per decoding step:

- wall milliseconds;
- GPU-busy milliseconds: the union of the CUDA kernels' and copies' intervals (what the GPU
  spent working; the rest of the step it waited for the host);
- the operators with the most self CPU time and the most self CUDA time, per step;
- kernels and copies launched per step;
- host-device synchronisations per step (``cudaStreamSynchronize``/``cudaDeviceSynchronize``/
  ``cudaMemcpy`` calls, e.g. from ``.item()`` or ``.tolist()``).

Random weights in the public shapes (``bench/engines.py``: ``smollm2-135m``, ``qwen2-0.5b``,
``qwen2-1.5b``); every row runs to ``--max-new-tokens`` (random weights draw no stop token).
Nothing is asserted; the table and ``--json`` are the output.

    python bench/gpu_decode_profile.py --models smollm2-135m,qwen2-1.5b --json out.json   # a GPU
    python bench/gpu_decode_profile.py --device cpu --models tiny --rows 8 --max-new-tokens 4 --modes eager
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync")


def busy_ms(events) -> float:
    """Milliseconds covered by the union of the device events' intervals (kernels, copies)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    total, end = 0.0, float("-inf")
    for s, e in spans:
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1000.0  # us -> ms


def profile_case(model_dir: str, name: str, mode: str, device: torch.device, args) -> dict:
    """One engine: a warm-up call, then one profiled call of the same shape."""
    from torch.profiler import ProfilerActivity, profile

    from rllib_dph.engines import make_engine
    from rllib_dph.engines.base import SamplingParams

    engine = make_engine("hf", model_dir, dtype=args.dtype, device=device, max_batch_size=args.rows,
                         compile_decode=mode == "compiled")
    vocab = engine.model.config.vocab_size
    prompts = torch.randint(3, vocab, (args.rows // args.n, args.prompt_len),
                            generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    t0 = time.perf_counter()
    engine.generate(prompts, params)
    first_s = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        groups = engine.generate(prompts, params)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - t0
    steps = max(len(c.token_ids) for g in groups for c in g)
    events = prof.events()
    device_events = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    syncs = sum(1 for e in events if e.name in SYNC_CALLS)
    averages = prof.key_averages()

    def top(attr: str) -> list[dict]:
        rows = sorted(averages, key=lambda a: getattr(a, attr), reverse=True)[: args.top]
        return [{"op": a.key, "ms_per_step": getattr(a, attr) / 1000.0 / steps, "calls_per_step": a.count / steps}
                for a in rows if getattr(a, attr) > 0]

    out = {
        "model": name, "mode": mode, "rows": args.rows, "steps": steps, "first_call_s": first_s,
        "wall_ms_per_step": wall_s * 1000 / steps,
        "gpu_busy_ms_per_step": busy_ms(device_events) / steps if device_events else None,
        "syncs_per_step": syncs / steps,
        "device_ops_per_step": len(device_events) / steps,
        "top_cpu": top("self_cpu_time_total"),
        "top_cuda": top("self_device_time_total") if device.type == "cuda" else [],
    }
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2-1.5b")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--top", type=int, default=8, help="operators listed per ranking")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    from engines import SIZES, save_random_model  # bench/engines.py

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model_dir = str(save_random_model(name, pathlib.Path(tmp) / name, dtype)) if name in SIZES else name
            for mode in args.modes.split(","):
                try:
                    rows.append(profile_case(model_dir, name, mode, device, args))
                except Exception as err:  # noqa: BLE001 - one case's failure is its row; the rest still run
                    rows.append({"model": name, "mode": mode, "error": f"{type(err).__name__}: {err}"[:500]})
                r = rows[-1]
                if "error" in r:
                    print(f"{name} {mode}: {r['error']}", flush=True)
                    continue
                busy = r["gpu_busy_ms_per_step"]
                print(f"\n{name} {mode}: {r['wall_ms_per_step']:.2f} ms/step wall, "
                      f"{'-' if busy is None else f'{busy:.2f}'} ms/step GPU busy, {r['syncs_per_step']:.1f} syncs/step, "
                      f"{r['device_ops_per_step']:.0f} kernels/step, "
                      f"first call {r['first_call_s']:.1f} s", flush=True)
                for key in ("top_cpu", "top_cuda"):
                    for op in r[key]:
                        print(f"  {key[4:]:>4} {op['ms_per_step']:7.3f} ms/step {op['calls_per_step']:6.1f} calls  {op['op'][:90]}")
                if args.json:
                    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
