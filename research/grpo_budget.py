"""Where GRPO's sharpening starts to cost pass@k: validation pass@k along a long GRPO run.

Trains `tuned_examples/grpo/sql_tiny_grpo.py` (16 prompts x 8 completions per iteration, one
optimizer step each) for `--iterations` iterations and, before training and every `--every`
iterations, evaluates the current policy on the first `--limit` prompts of `sql_synth/test`:
`--n` samples per prompt at temperature 1 (64 new tokens, as in training) plus one greedy
completion. Every evaluation uses the same sampling seed (common random numbers), so the
checkpoints differ by their weights only. Prints and writes (`--out`):

- a table: iteration, greedy, pass@1 and pass@k at the largest k with 95 % bootstrap intervals
  over prompts, and the paired difference of pass@k(max) to the base model (iteration 0);
- `curve.json`: every evaluation's summary, intervals and paired differences;
- `curve.png`: pass@1 and pass@k(max) against iterations with their bands (0-100 % axis).

The first evaluation after which pass@k(max) stays below the base model's, with an interval
that excludes 0, is where GRPO's sharpening costs coverage (the DPH-RL paper's collapse); the
reproduction's budget comes from that curve (docs/results/ordinary-suite.md, "How long GRPO must train to cost pass@k").

    python research/grpo_budget.py                         # 200 iterations, every 20, n = 32, 100 prompts
    python research/grpo_budget.py --iterations 40 --every 20 --limit 20 --n 8    # a smoke run
    python research/grpo_budget.py --split sql_synth/test_ties --n 64 \
        --config '{"lr": 1e-3, "num_epochs": 4}'                   # another split and setting

`--example` trains another tuned example, `--config` overrides its fields (JSON, as
`rllib train --config`), `--split` evaluates another bundled split. `--base-cache DIR` keeps
the base model's evaluation in DIR (keyed by the model's fingerprint, split and evaluation settings), so a sweep
of settings (`research/collapse_search.py`) evaluates the base model once.
"""

import argparse
import hashlib
import json
import pathlib
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "tuned_examples/grpo/sql_tiny_grpo.py"
SPLIT = "sql_synth/test"


def evaluate(algo, env, settings, base=None) -> tuple:
    """The current policy's EvalResult on ``env`` and its row of numbers."""
    from rllib_dph.evaluation import evaluate_engine
    from rllib_dph.evaluation.intervals import paired_difference_interval

    result = evaluate_engine(algo.env_runner.engine, env, settings)
    summary, intervals = result.summary(), result.intervals()
    k_max = max(settings.ks)
    row = {
        "iteration": algo.iteration,
        "summary": {k: v for k, v in summary.items() if k != "style_counts"},
        "intervals": {k: list(v) for k, v in intervals.items()},
    }
    if base is not None:
        for metric in ("greedy_accuracy", f"pass@{k_max}"):
            diff = float(np.mean(result.per_prompt(metric)) - np.mean(base.per_prompt(metric)))
            row[f"{metric} - base"] = [diff, list(paired_difference_interval(result.per_prompt(metric), base.per_prompt(metric)))]
    return result, row


def line(row: dict, k_max: int) -> str:
    from rllib_dph.evaluation.intervals import format_interval

    s, ci = row["summary"], row["intervals"]
    cells = [format_interval(s[m], ci[m], scale=100) for m in ("greedy_accuracy", "pass@1", f"pass@{k_max}")]
    diff = row.get(f"pass@{k_max} - base")
    cells.append(format_interval(diff[0], diff[1], scale=100) if diff else "—")
    return f"| {row['iteration']} | " + " | ".join(cells) + " |"


def plot(rows: list, k_max: int, out_png: pathlib.Path, split: str = SPLIT) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    its = [r["iteration"] for r in rows]
    for metric in ("pass@1", f"pass@{k_max}", "greedy_accuracy"):
        line_, = ax.plot(its, [100 * r["summary"][metric] for r in rows], marker="o", label=metric)
        low, high = zip(*(r["intervals"][metric] for r in rows))
        ax.fill_between(its, 100 * np.array(low), 100 * np.array(high), color=line_.get_color(), alpha=0.15)
    ax.set_ylim(0, 100)
    ax.set_xlabel("GRPO iteration")
    ax.set_ylabel(f"{split} (%), 95 % band")
    ax.set_title("GRPO on tiny-sql-math: validation along training", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def base_result(algo, env, settings, args, config):
    """The base model's evaluation: read from ``--base-cache`` when made with the same settings."""
    from rllib_dph.evaluation import EvalResult
    from rllib_dph.files import write_json_atomic
    from rllib_dph.models.hub import model_fingerprint
    from rllib_dph.models.build.prepare import prepare_model

    # The fingerprint, not the name: a rebuilt model of the same name is another base model.
    key = json.dumps([model_fingerprint(prepare_model(config.model_name).location), args.split, args.n, args.limit,
                      settings.sampling.seed, settings.sampling.max_new_tokens], sort_keys=True)
    name = f"base-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    cache = pathlib.Path(args.base_cache) / name if args.base_cache else None
    if cache is not None and cache.is_file() and json.loads(cache.read_text())["key"] == key:
        result = EvalResult.from_json(cache.with_suffix(".result.json"))
        return evaluate_cached(result, settings, algo.iteration)
    result, row = evaluate(algo, env, settings)
    if cache is not None:
        result.to_json(cache.with_suffix(".result.json"))
        write_json_atomic(cache, {"key": key})  # after the result: a key never names a missing result
    return result, row


def evaluate_cached(result, settings, iteration: int) -> tuple:
    """The row of a stored evaluation (as :func:`evaluate` makes it)."""
    summary, intervals = result.summary(), result.intervals()
    row = {"iteration": iteration, "summary": {k: v for k, v in summary.items() if k != "style_counts"},
           "intervals": {k: list(v) for k, v in intervals.items()}}
    return result, row


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--example", default=str(EXAMPLE), help="tuned example to train")
    parser.add_argument("--config", default="{}", help="JSON overrides of the example's config fields")
    parser.add_argument("--split", default=SPLIT, help="bundled split to evaluate on")
    parser.add_argument("--base-cache", default=None, help="folder that keeps the base model's evaluation")
    parser.add_argument("--out", default=str(REPO / "research/out/grpo_budget"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    import ray
    import torch

    from rllib_dph.evaluation import EvalSettings
    from rllib_dph.cli.experiments import load_tuned_example
    from rllib_dph.envs import make_env

    torch.set_num_threads(2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config, _ = load_tuned_example(args.example)
    config.update_from_dict({**json.loads(args.config), "seed": args.seed, "val_interval": 0})
    algo = config.build_algo()
    env = make_env(config.env, {**config.env_config, "data": args.split})
    settings = EvalSettings(sampling=config.sampling_params(n=args.n, temperature=1.0, top_p=1.0, seed=12345,
                                                            top_k_logprobs=0), limit=args.limit)
    k_max = max(settings.ks)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    base, row = base_result(algo, env, settings, args, config)
    rows, rewards = [row], []
    print(f"| iteration | greedy | pass@1 | pass@{k_max} | pass@{k_max} − base |\n| --- | --- | --- | --- | --- |")
    print(line(row, k_max), flush=True)
    for _ in range(args.iterations):
        rewards.append(float(algo.train()["env_runners"]["reward_mean"]))
        if algo.iteration % args.every == 0:
            rows.append(evaluate(algo, env, settings, base)[1])
            print(line(rows[-1], k_max), flush=True)
    algo.stop()
    seconds = time.perf_counter() - start
    (out / "curve.json").write_text(json.dumps({"args": vars(args), "rows": rows, "train_reward": rewards, "seconds": seconds}, indent=1))
    plot(rows, k_max, out / "curve.png", args.split)
    print(f"{args.iterations} iterations in {seconds:.0f} s; wrote {out / 'curve.json'}, {out / 'curve.png'}")


if __name__ == "__main__":
    main()
