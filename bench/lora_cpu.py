"""LoRA against full fine-tuning on CPU: step time, weight-sync time and peak RSS on one batch.

Each mode runs in its own fresh process (so ``ru_maxrss`` is that mode's peak): it builds one
local GRPO learner and an HF rollout engine on the same model, samples one batch with a fixed
seed from the engine (the initial policy, identical in both modes: LoRA's B starts at 0), runs
``--updates`` learner updates on that batch (the first allocates Adam's state; the median of the
others is reported), then times the weight sync ``module.get_state()`` -> ``engine.update_weights``
(the median of ``--syncs``). In LoRA mode it also times the alternative sync, merge-and-load
(``lora.merged_state`` -> a full ``update_weights`` into a plain engine), and the decode time of
the same prompts on the engine with live adapters against the merged plain engine.

    python bench/lora_cpu.py --model smollm2-135m-instruct --rank 16 --rows 8 --group 4 --response 64

Prints one JSON line per mode and a table; docs/lora.md has a run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

RESULT = "RESULT "


def _config(args, lora_on: bool):
    from rllib_dph.algorithms.grpo import GRPOConfig

    config = (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
        .llm(model_name=args.model, max_response_length=args.response)
        .training(group_size=args.group, prompts_per_step=args.rows // args.group, lr=1e-5)
        .debugging(seed=0)
    )
    if lora_on:
        config.llm(lora={"r": args.rank, "alpha": 2 * args.rank, "target_modules": "all-linear", "dropout": 0.0})
    return config


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_mode(args, lora_on: bool) -> dict:
    """One mode in this process: the measurements as a dict."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from rllib_dph import columns as C
    from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner
    from rllib_dph.losses.advantages import group_advantages

    torch.set_num_threads(args.threads)
    config = _config(args, lora_on)
    runner = LLMEnvRunner(config=config)
    learner = config.build_learner(env=runner.env)
    module = learner.module[DEFAULT_MODULE_ID]
    columns = runner.sample(num_prompts=args.rows // args.group)
    columns[C.REWARDS] = (torch.arange(len(columns[C.REWARDS])) % 2).float().numpy()  # fixed, non-zero advantages
    columns[C.ADVANTAGES] = group_advantages(torch.as_tensor(columns[C.REWARDS]), torch.as_tensor(columns[C.GROUP_IDS])).numpy()
    batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=len(columns[C.REWARDS]))
    times = [_median_time(lambda: learner.update(batch=batch, num_epochs=1), 1) for _ in range(args.updates)]
    sync = _median_time(lambda: runner.engine.update_weights(module.get_state()), args.syncs)
    out = {
        "mode": "lora" if lora_on else "full",
        "tokens": int(columns[C.ATTENTION_MASK].sum()),
        "trainable_params": sum(p.numel() for p in learner.get_optimizer().param_groups[0]["params"]),
        "step_s": statistics.median(times[1:]),
        "first_step_s": times[0],
        "sync_s": sync,
        "sync_tensors_mb": sum(v.numel() * v.element_size() for v in module.get_state().values() if torch.is_tensor(v)) / 2**20,
    }
    if lora_on:
        out.update(_merge_and_load(args, module, runner))
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def _merge_and_load(args, module, runner) -> dict:
    """The alternative sync and the decode cost of live adapters against merged weights."""
    from rllib_dph.policy import lora
    from rllib_dph.engines import DEFAULT_ENGINE, SamplingParams, make_engine

    plain = make_engine(DEFAULT_ENGINE, args.model, dtype="float32")  # the HF engine
    merge_sync = _median_time(lambda: plain.update_weights(lora.merged_state(module.model)), args.syncs)
    prompts = [runner._encode(int(i)) for i in runner._shard[: args.rows // args.group]]
    params = SamplingParams(n=args.group, temperature=1.0, max_new_tokens=args.response, seed=0)
    live = _median_time(lambda: runner.engine.generate(prompts, params), 2)
    merged = _median_time(lambda: plain.generate(prompts, params), 2)
    return {"merge_and_load_sync_s": merge_sync, "decode_live_adapters_s": live, "decode_merged_s": merged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rows", type=int, default=8, help="rows (completions) of the batch")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--response", type=int, default=64, help="max response tokens")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", choices=("full", "lora"), help="run one mode in this process (internal)")
    args = parser.parse_args()
    if args.mode:
        print(RESULT + json.dumps(run_mode(args, args.mode == "lora")), flush=True)
        return
    rows = []
    for mode in ("full", "lora"):
        proc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode], capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)), None)
        if line is None:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(line[len(RESULT):]))
        print(line[len(RESULT):], flush=True)
    keys = sorted({k for row in rows for k in row} - {"mode"})
    print("| | " + " | ".join(row["mode"] for row in rows) + " |\n|---|" + "---|" * len(rows))
    for key in keys:
        print(f"| {key} | " + " | ".join(_fmt(row.get(key)) for row in rows) + " |")


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
