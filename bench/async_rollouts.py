"""Synchronous vs asynchronous sampling (``max_staleness``): iterations/s and generated tokens/s.

For each number of env runners (``--runners``) and each staleness bound k (``--k``), runs the tiny
tuned GRPO example for a warm-up iteration and ``--iterations`` measured ones, and prints
iterations/s, generated tokens/s, the trained rows' mean staleness and rows dropped. Beside each
row it prints the overlap bound of that many env runners: the synchronous (k = 0) step time
divided by its longest phase (sampling or learner update), i.e. the speed-up a perfect overlap of
the two phases could give on the same actors and cores, and the measured speed-up over k = 0.

    python bench/async_rollouts.py                               # k 0 1 2 4, 1 and 2 runners
    python bench/async_rollouts.py --k 0 1 --runners 1 --iterations 3
    python bench/async_rollouts.py --learner-threads 1      # the learner on one core, the runners on the other
    # one GPU (the local learner on it, the env runner sharing it; the step "async" of
    # tools/offline_kit/gpu_suite.py):
    python bench/async_rollouts.py --example tuned_examples/grpo/sql_smollm2_grpo.py --k 0 1 --runners 1 \\
        --config '{"num_gpus_per_env_runner": 0.5}' --json async.json
"""

import argparse
import json
import pathlib
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def measure(example: str, overrides: dict, iterations: int) -> dict:
    """Seconds per iteration, generated tokens/s, phase times and staleness of one setting."""
    from rllib_dph.cli.experiments import load_tuned_example

    config, _ = load_tuned_example(example)
    config.update_from_dict(overrides)
    algo = config.build_algo()
    algo.train()  # warm-up: first-call overheads, and the first round ahead in async mode
    seconds, tokens, sampling, update, staleness, dropped = [], [], [], [], [], 0
    for _ in range(iterations):
        t0 = time.perf_counter()
        result = algo.train()
        seconds.append(time.perf_counter() - t0)
        runners = result["env_runners"]
        tokens.append(runners["response_length_mean"] * runners["num_env_steps_sampled"])
        sampling.append(result["step_times"]["sampling_s"])
        update.append(result["step_times"]["learner_update_s"] + result["step_times"]["weight_sync_s"])
        staleness.append(result["staleness_mean"])
        dropped += result["num_stale_rows_dropped"]
    algo.stop()
    step = sum(seconds) / iterations
    return {
        "s_per_iter": step,
        "iter_per_s": 1 / step,
        "tokens_per_s": sum(tokens) / sum(seconds),
        "sampling_s": sum(sampling) / iterations,
        "update_s": sum(update) / iterations,
        "staleness_mean": sum(staleness) / iterations,
        "rows_dropped": int(dropped),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", default=str(REPO / "tuned_examples/grpo/sql_tiny_grpo.py"))
    parser.add_argument("--k", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--config", default="{}", help="more config overrides as JSON")
    parser.add_argument("--learner-threads", type=int,
                        help="torch threads of this process, where the local learner updates (default: torch's, "
                        "one per core); the env runners are Ray actors with their own")
    parser.add_argument("--json", help="also write every row (with its speed-up and bound) to this JSON file")
    args = parser.parse_args()

    import ray
    import torch

    if args.learner_threads:
        torch.set_num_threads(args.learner_threads)
    print(f"learner threads: {torch.get_num_threads()}")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    print(f"{'runners':>7} {'k':>2} {'iter/s':>7} {'tok/s':>7} {'stale':>5} {'dropped':>7} {'speed-up':>8} {'bound':>6}")
    for runners in args.runners:
        sync = None
        for k in sorted(args.k):
            overrides = {"num_env_runners": runners, "num_cpus_per_env_runner": 0.5, "max_staleness": k,
                         **json.loads(args.config)}
            m = measure(args.example, overrides, args.iterations)
            sync = m if k == 0 else sync
            row = {"runners": runners, "k": k, **m, "speed_up": m["iter_per_s"] / sync["iter_per_s"] if sync else None,
                   "bound": sync["s_per_iter"] / max(sync["sampling_s"], sync["update_s"]) if sync else None}
            speedup = f"{row['speed_up']:8.2f}" if sync else "       -"
            bound = f"{row['bound']:6.2f}" if sync else "     -"
            print(f"{runners:>7} {k:>2} {m['iter_per_s']:7.3f} {m['tokens_per_s']:7.1f} {m['staleness_mean']:5.2f} "
                  f"{m['rows_dropped']:>7} {speedup} {bound}", flush=True)
            print("  " + json.dumps(row), flush=True)
            rows.append(row)
            if args.json:
                pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    ray.shutdown()


if __name__ == "__main__":
    main()
