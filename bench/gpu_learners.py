"""Learner updates across Ray learners: update seconds and peak memory per learner against the
preflight's prediction (``rllib_dph.cli.memory``), for GRPO and DPH-JS, DDP and FSDP2, with and
without gradient checkpointing.

Each case builds the real learner group (``config.build_learner_group``: ``--num-learners``
Ray learner actors, ``num_gpus_per_learner=--gpus-per-learner``, ``sharding``), feeds it one
synthetic batch (``--rows`` rows of ``--prompt`` + ``--response`` random tokens, groups of 8,
advantages ±1, μ = -5 per token; DPH-JS's learners add one D_pef row per 8 exploration rows with
stored reference log-probs, from a synthetic D_pef file), runs one warm-up update (it allocates Adam's state), resets each
learner's CUDA peak, then times ``--iters`` updates. Per learner it reports
``torch.cuda.max_memory_allocated`` over the timed updates (tensors only, like the estimate;
the CUDA context and allocator cache are not counted) next to ``learner_estimate`` for the same
config (``memory.learner_setup`` + ``memory.learner_microbatch``: what ``rllib train``'s
preflight computes). On a CPU (``--device cpu``) the same cases run on gloo and report no
memory, which checks the script, not the numbers.

    python bench/gpu_learners.py --model qwen2-0.5b --json out.json       # 2 GPUs, one learner on each
    python bench/gpu_learners.py --num-learners 1 --cases ddp:grpo,ddp:dph_js   # one GPU
    python bench/gpu_learners.py --device cpu --model tiny --rows 16 --prompt 16 --response 16 \\
        --cases ddp:grpo,fsdp2:dph_js:ckpt --iters 1                     # a check of the script on CPU

``--model``: a size of ``bench/engines.py`` (random weights, written to a temporary folder) or
a model folder. A case that fails (out of memory, say) is
reported with its error and the next case runs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

GROUP = 8


def parse_case(text: str) -> dict:
    """``"fsdp2:dph_js:ckpt"`` → sharding, algorithm, gradient checkpointing and LoRA (the
    defaults, ``lora.LORA_DEFAULTS``) of one case."""
    sharding, algo, *flags = text.split(":")
    if sharding not in ("ddp", "fsdp2") or algo not in ("grpo", "dph_js") or set(flags) - {"ckpt", "lora"}:
        raise SystemExit(f"--cases {text!r}: expected (ddp|fsdp2):(grpo|dph_js)[:ckpt][:lora]")
    return {"sharding": sharding, "algo": algo, "checkpointing": "ckpt" in flags, "lora": "lora" in flags}


def write_pef_file(folder: pathlib.Path, args, vocab: int) -> str:
    """A synthetic ``d_pef.parquet`` (the columns ``rllib presample`` writes): 64 rows of random
    prompt and response tokens with stored reference log-probs of -5 per token."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    rows = 64
    table = pa.table({
        "prompt_ids": [rng.integers(3, vocab, args.prompt).tolist() for _ in range(rows)],
        "response_ids": [rng.integers(3, vocab, args.response).tolist() for _ in range(rows)],
        "ref_logp": [[-5.0] * args.response for _ in range(rows)],
    })
    path = folder / "d_pef.parquet"
    pq.write_table(table, path)
    return str(path)


def case_config(case: dict, folder: str, pef_path: str, args):
    """The GRPO or DPH-JS config of one case (bf16 on a GPU, one mini-batch per update); DPH-JS's
    learners add one D_pef row of ``pef_path`` per 8 exploration rows (``AddPefRows``)."""
    from rllib_dph.algorithms.dph import DPHConfig
    from rllib_dph.algorithms.grpo import GRPOConfig

    if case["algo"] == "dph_js":
        config = DPHConfig().dph(divergence="js", pef_coeff=0.2, pef_ratio=8, pef_path=pef_path)
    else:
        config = GRPOConfig()
    from rllib_dph.policy.lora import LORA_DEFAULTS

    gpu = args.device == "cuda"
    return (
        config.environment("rllib_dph/SQL-v0")
        .llm(model_name=folder, dtype="bfloat16" if gpu else "float32", max_response_length=args.response,
             gradient_checkpointing=case["checkpointing"], lora=dict(LORA_DEFAULTS) if case["lora"] else None)
        .training(group_size=GROUP, prompts_per_step=args.rows // GROUP, minibatch_size=args.rows, lr=1e-6)
        .learners(num_learners=args.num_learners, sharding=case["sharding"],
                  num_gpus_per_learner=args.gpus_per_learner if gpu else 0,
                  num_cpus_per_learner=1 if gpu else 0.5)
    )


def _reset_peak(learner) -> int:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    return 0


def _peak(learner) -> dict:
    if not torch.cuda.is_available():
        return {"peak": float("nan"), "device": "cpu"}
    torch.cuda.synchronize()
    return {"peak": torch.cuda.max_memory_allocated(), "device": torch.cuda.get_device_name()}


def run_case(case: dict, folder: str, pef_path: str, args) -> dict:
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from memory import _spaces  # bench/memory.py
    from rllib_dph import columns as C
    from rllib_dph.learners.splits import shard_groups
    from rllib_dph.cli.memory import learner_estimate, learner_microbatch, learner_setup, model_shape

    config = case_config(case, folder, pef_path, args)
    shape = model_shape(folder)
    estimate = learner_estimate(shape, learner_microbatch(config, args.prompt), learner_setup(config, args.device))
    r = dict(case, model=args.model, num_learners=args.num_learners, gpus_per_learner=args.gpus_per_learner,
             rows=args.rows, prompt=args.prompt, response=args.response,
             predicted_gb=estimate.total / 1e9, predicted=estimate.summary())
    t0 = time.perf_counter()
    group = config.build_learner_group(env=None, spaces={DEFAULT_MODULE_ID: _spaces()})
    r["build_s"] = time.perf_counter() - t0
    try:
        from memory import _update_batch  # bench/memory.py

        batch = _update_batch(args.rows, args.prompt, args.response, shape.vocab, GROUP)
        batch[C.CORRECT] = batch[C.ADVANTAGES] > 0  # the per-row columns a sampled batch has
        batch[C.TRUNCATED] = np.zeros(args.rows, dtype=bool)
        batch[C.PROMPT_LENGTH] = np.full(args.rows, args.prompt, dtype=np.int64)
        batch[C.RESPONSE_LENGTH] = np.full(args.rows, args.response, dtype=np.int64)
        shards = shard_groups(batch, max(1, args.num_learners))
        batches = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(s)}, env_steps=len(s[C.INPUT_IDS])) for s in shards]

        def update():
            t = time.perf_counter()
            results = group.update(batches=batches, num_minibatches=1) if args.num_learners > 1 else \
                group.update(batch=batches[0], num_minibatches=1)
            return time.perf_counter() - t, results

        r["first_update_s"], _ = update()
        group.foreach_learner(_reset_peak)
        times = [update()[0] for _ in range(args.iters)]
        r["update_s"] = statistics.median(times)
        r["tokens_per_s"] = len(batch[C.INPUT_IDS]) * (args.prompt + args.response) / r["update_s"]
        peaks = [x.get() if hasattr(x, "get") else x for x in group.foreach_learner(_peak)]
        r["peak_gb"] = [p["peak"] / 1e9 for p in peaks]
        r["device"] = peaks[0]["device"]
        if args.device == "cuda":
            r["error_pct"] = 100 * (estimate.total / 1e9 - max(r["peak_gb"])) / max(r["peak_gb"])
    finally:
        group.shutdown()
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="qwen2-0.5b", help="a size of bench/engines.py or a model folder")
    parser.add_argument("--cases", default="ddp:grpo,fsdp2:grpo,ddp:grpo:ckpt,fsdp2:grpo:ckpt,ddp:dph_js,fsdp2:dph_js",
                        help="comma-separated SHARDING:ALGO[:ckpt][:lora]")
    parser.add_argument("--num-learners", type=int, default=2)
    parser.add_argument("--gpus-per-learner", type=float, default=1.0,
                        help="GPUs per learner; below 1 only for one learner (NCCL refuses two ranks on one GPU)")
    parser.add_argument("--rows", type=int, default=64, help="exploration rows per update (groups of 8)")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--iters", type=int, default=2, help="timed updates after 1 warm-up")
    parser.add_argument("--deadline-s", type=float, default=None, help="start no case after this many seconds")
    parser.add_argument("--max-failures", type=int, default=None,
                        help="skip the remaining cases after this many failed ones (e.g. NCCL refusing a shared GPU)")
    parser.add_argument("--json", default=None, help="write the results here (after every case)")
    args = parser.parse_args()
    start = time.perf_counter()

    import ray

    from engines import SIZES, save_random_model  # bench/engines.py

    cases = [parse_case(c) for c in args.cases.split(",")]
    gpus = 1 if args.device == "cuda" else 0
    ray.init(include_dashboard=False, log_to_driver=True, num_gpus=gpus,
             num_cpus=max(2, args.num_learners + 1))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.model in SIZES:
            dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
            folder = str(save_random_model(args.model, pathlib.Path(tmp) / args.model, dtype))
        else:
            folder = args.model
        from rllib_dph.cli.memory import model_shape

        pef_path = write_pef_file(pathlib.Path(tmp), args, model_shape(folder).vocab)
        for case in cases:
            if args.deadline_s and time.perf_counter() - start > args.deadline_s:
                results.append(dict(case, skipped=f"past --deadline-s {args.deadline_s}"))
                continue
            failures = sum("error" in r for r in results)
            if args.max_failures is not None and failures >= args.max_failures:
                results.append(dict(case, skipped=f"{failures} cases failed (--max-failures {args.max_failures})"))
                continue
            try:
                r = run_case(case, folder, pef_path, args)
            except Exception as err:  # noqa: BLE001 - one failed case must not hide the others
                traceback.print_exc()
                r = dict(case, error=f"{type(err).__name__}: ...{str(err)[-700:]}")
            results.append(r)
            print("case", json.dumps(r), flush=True)
            if args.json:
                pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    ray.shutdown()
    print(f"\n== learner updates, {args.num_learners} learners x {args.gpus_per_learner} GPU, {args.model}, "
          f"{args.rows} rows x ({args.prompt} + {args.response}) tokens; median of {args.iters} after 1 warm-up")
    print(f"{'case':<20}{'s/update':>9}{'tok/s':>9}{'peak GB per learner':>22}{'predicted GB':>13}{'error':>8}")
    for r in results:
        name = f"{r['sharding']}:{r['algo']}{':ckpt' if r['checkpointing'] else ''}{':lora' if r.get('lora') else ''}"
        if "update_s" not in r:
            print(f"{name:<20} {r.get('error', r.get('skipped', ''))[:200]}")
            continue
        peaks = "/".join(f"{p:.2f}" for p in r["peak_gb"])
        err = f"{r['error_pct']:+.0f}%" if "error_pct" in r else "-"
        print(f"{name:<20}{r['update_s']:>9.3f}{r['tokens_per_s']:>9.0f}{peaks:>22}{r['predicted_gb']:>13.2f}{err:>8}")


if __name__ == "__main__":
    main()
