"""GRPO's ratio clip vs DPPO trust regions vs the off-policy corrections (CISPO, TIS, ICEPOP, IPO)
on the tiny SQL suite, same seeds and budget.

For each variant it trains the tiny tuned example (tuned_examples/grpo/sql_tiny_grpo.py) for
`--iterations` iterations per seed and records the training reward, |π − μ| and the masked
fraction per iteration. The tuned example takes one optimizer step per rollout batch, so π_θ
equals μ when each token is scored and no trust region ever acts; this benchmark therefore
runs it off-policy (`OFF_POLICY`: several mini-batches and epochs per batch), the regime the
trust regions are for. It prints a table (final reward, steps until the 5-iteration running
mean of the reward reaches the target, final |π − μ| and masked fraction) and writes
`trust_region.md`, `trust_region.json` and `trust_region.png` (reward curves) to `--out`.
It also measures what computing each mask costs as a share of the learner's update time on a
real batch (targets: binary ≤ 1 %, top-K ≤ 5 %).

    python research/trust_region.py                    # 9 variants x 1 seed x 30 iterations
    python research/trust_region.py --seeds 0 1 2 --iterations 40 --workers 15
    python research/trust_region.py --mask-cost-only
    # every correction (and none) at staleness 4, one remote env runner,
    # one optimizer step per batch (staleness is then the only source of π ≠ μ), 3 seeds,
    # validation pass@1 on the first 100 prompts of sql_synth/test at the end:
    python research/trust_region.py --max-staleness 4 --seeds 0 1 2 --iterations 30 --out research/out/async_k4
    # each correction against the synchronous control of the same regime and seeds, seed by seed
    # (per-seed values, paired t interval and reading rule, Welch, permutation p, bootstraps):
    python research/trust_region.py --max-staleness 0 --variants none --seeds 0 1 2 --iterations 30 --out research/out/async_k0
    python research/trust_region.py --max-staleness 4 --seeds 0 1 2 --iterations 30 --out research/out/async_k4 \
        --control research/out/async_k0/trust_region.json
    # the same table from runs written before:
    python research/trust_region.py --read research/out/async_k4/trust_region.json --control research/out/async_k0/trust_region.json

With ``--max-staleness K`` the runs sample from one remote env runner with
``training(max_staleness=K)`` (K > 0: asynchronously; K = 0: the synchronous control of the same
regime) instead of taking several mini-batches and epochs per batch, the variants
add "none" (no mask, no clip) and OPSM, and each run also records the approximate KL to μ and
the bad-update fraction per iteration and its validation pass@1 at the end, in all and per
prompt.
"""

import argparse
import json
import math
import pathlib
import time

import numpy as np

from workers import worker_pool  # research/workers.py

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "tuned_examples/grpo/sql_tiny_grpo.py"

#: Config overrides shared by every variant: 8 optimizer steps per rollout batch (4 mini-batches
#: x 2 epochs), so later mini-batches are updated by a policy that has moved away from μ.
OFF_POLICY = {"minibatch_size": 32, "num_epochs": 2}
#: Variant name → config overrides of the tuned example.
VARIANTS = {
    "GRPO clip": {"trust_region": {"kind": "ppo", "low": 0.2, "high": 0.2}},
    "DPPO Binary-TV": {"trust_region": "dppo_binary_tv"},
    "DPPO Binary-KL": {"trust_region": "dppo_binary_kl"},
    "DPPO TopK-TV": {"trust_region": "dppo_topk_tv", "rollout_top_k": 20},
    "CISPO (C=5)": {"trust_region": {"kind": "cispo", "truncation": 5.0}},
    "TIS (C=2)": {"trust_region": {"kind": "tis", "truncation": 2.0}},
    "ICEPOP [0.5, 5]": {"trust_region": "icepop"},
    "IPO (eps=0.3)": {"trust_region": "ipo"},
}
#: Added under ``--max-staleness``: no correction at all, and the sequence-level mask.
ASYNC_VARIANTS = {"none": {"trust_region": "none"}, "OPSM": {"trust_region": "opsm"}}
#: Validation of the asynchronous runs: greedy-free pass@1 from 4 samples of 100 test prompts.
VALIDATION = {"val_env_config": {"data": "sql_synth/test"}, "val_n": 4, "val_limit": 100}
#: Trust regions whose mask cost is measured (``losses.TRUST_REGIONS`` names), each at its
#: default thresholds.
MASK_KINDS = ("ppo", "dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv", "dppo_topk_kl", "icepop", "ipo", "opsm")


def _config(overrides: dict, seed: int, model: str | None, max_staleness: int | None = None, extra: dict | None = None):
    from rllib_dph.cli.experiments import load_tuned_example

    config, _ = load_tuned_example(str(EXAMPLE))
    regime = OFF_POLICY if max_staleness is None else {"max_staleness": max_staleness, "num_env_runners": 1, **VALIDATION}
    config.update_from_dict({**regime, **(extra or {}), **overrides, "seed": seed,
                             **({"model_name": model} if model else {})})
    return config


def train_curves(name: str, overrides: dict, seed: int, iterations: int, model: str | None,
                 max_staleness: int | None = None, extra: dict | None = None) -> dict:
    """Per-iteration training reward, |π − μ|, masked fraction, approximate KL to μ and
    bad-update fraction of one run; with ``max_staleness`` also the final validation pass@1, in
    all and per prompt (``validation_prompts``: task ids and pass@1 of each)."""
    import torch

    torch.set_num_threads(1)
    algo = _config(overrides, seed, model, max_staleness, extra).build_algo()
    curve = {"reward": [], "abs_prob_diff": [], "masked_fraction": [], "approx_kl": [], "bad_update_fraction": [],
             "staleness": [], "seconds": []}
    for _ in range(iterations):
        t0 = time.perf_counter()
        result = algo.train()
        learner = result["learners"]["default_policy"]
        curve["reward"].append(float(result["env_runners"]["reward_mean"]))
        curve["abs_prob_diff"].append(float(learner["abs_prob_diff_mean"]))
        curve["masked_fraction"].append(float(learner["clip_fraction"]))
        curve["approx_kl"].append(float(learner["approx_kl_to_behavior"]))
        curve["bad_update_fraction"].append(float(learner["bad_update_fraction"]))
        curve["staleness"].append(float(result.get("staleness_mean", 0.0)))
        curve["seconds"].append(time.perf_counter() - t0)
        print(f"  {name} seed {seed} it {len(curve['reward'])}: reward {curve['reward'][-1]:.3f}")
    if max_staleness is not None:
        evaluation = algo.evaluate_held_out_records()
        curve["validation"] = {k: float(v) for k, v in evaluation.flat_metrics().items() if isinstance(v, (int, float))}
        curve["validation_prompts"] = {"task_ids": [r.task_id for r in evaluation.records],
                                       "pass@1": [float(np.mean(r.correct)) for r in evaluation.records]}
    algo.stop()
    return curve


def running_mean(values: list[float], window: int = 5) -> np.ndarray:
    """Mean of the last ``window`` values at each iteration (fewer at the start)."""
    cumsum = np.cumsum(np.insert(np.asarray(values, dtype=float), 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (cumsum[1:] - cumsum[np.arange(1, len(values) + 1) - counts]) / counts


def steps_to(rewards: list[float], target: float) -> float:
    """First iteration (1-based) whose 5-iteration running mean reward reaches ``target``; inf if none."""
    return next((i + 1 for i, r in enumerate(running_mean(rewards)) if r >= target), math.inf)


def mask_cost(model: str | None) -> dict[str, float]:
    """Time of each trust-region mask over the learner update time on one real batch."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from rllib_dph import columns as C
    from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner
    from rllib_dph.losses.advantages import group_advantages
    from rllib_dph.losses.trust_regions import TRUST_REGIONS, trust_region_mask

    config = _config({"rollout_top_k": 20}, 0, model)
    runner = LLMEnvRunner(config=config)
    batch = runner.sample()
    batch[C.ADVANTAGES] = group_advantages(
        torch.as_tensor(batch[C.REWARDS]), torch.as_tensor(batch[C.GROUP_IDS])
    ).numpy()
    learner = config.build_learner(env=runner.env)
    rows = len(batch[C.REWARDS])
    ma_batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=rows)
    learner.update(batch=ma_batch, num_epochs=1, minibatch_size=rows)  # warm-up
    t0 = time.perf_counter()
    repeats = 3
    for _ in range(repeats):
        learner.update(batch=ma_batch, num_epochs=1, minibatch_size=rows)
    update_s = (time.perf_counter() - t0) / repeats

    logp = torch.as_tensor(batch[C.BEHAVIOR_LOGP]) + 0.01 * torch.randn(batch[C.BEHAVIOR_LOGP].shape)
    q = torch.as_tensor(batch[C.BEHAVIOR_LOGP])
    topk_q = torch.as_tensor(batch[C.TOPK_BEHAVIOR_LOGP])
    topk_p = topk_q + 0.01 * torch.randn(topk_q.shape)
    adv = torch.as_tensor(batch[C.ADVANTAGES])[:, None]
    shares = {"learner_update_s": update_s}
    response = torch.as_tensor(batch[C.RESPONSE_MASK]).bool()
    for kind in MASK_KINDS:
        kw = dict(topk_logp=topk_p, topk_behavior_logp=topk_q) if TRUST_REGIONS[kind].needs_topk else {}
        region = _config({"trust_region": kind}, 0, model).trust_region_setting
        kw.update(kind=kind, low=region.low, high=region.high, response_mask=response)
        trust_region_mask(logp, q, adv, **kw)
        t0 = time.perf_counter()
        for _ in range(20):
            trust_region_mask(logp, q, adv, **kw)
        shares[kind] = (time.perf_counter() - t0) / 20 / update_s
    return shares


#: The reading rule of a correction's validation pass@1 minus the synchronous control's, on its
#: paired t interval over seeds (docs/results/async.md, fixed before its first run): below 0
#: degrades; containing 0 with its lower end above -0.05 keeps learning; else cannot tell.
KEEPS_LEARNING_LOW = -0.05


def verdict(low: float, high: float) -> str:
    """The reading of a correction's paired t interval against the control (:data:`KEEPS_LEARNING_LOW`)."""
    if high < 0:
        return "degrades"
    if low <= 0 <= high and low > KEEPS_LEARNING_LOW:
        return "keeps learning"
    return "cannot tell"


def _prompt_matrix(runs: list[dict], where: str, ids: list[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """(S, P) per-prompt validation pass@1 of a variant's seeds and the prompts' task ids; every
    seed must have evaluated ``ids`` (default: run 0's prompts)."""
    ids = runs[0]["validation_prompts"]["task_ids"] if ids is None else ids
    for i, run in enumerate(runs):
        if run["validation_prompts"]["task_ids"] != ids:
            raise ValueError(f"{where}, run {i}: its validation prompts differ from the control's run 0; "
                             "the per-prompt comparison needs the same prompts in every run.")
    return np.array([run["validation_prompts"]["pass@1"] for run in runs]), ids


def control_statistics(curves: dict, control: list[dict]) -> tuple[str, dict]:
    """A Markdown table of every variant's validation pass@1 against the synchronous control's,
    seed s against seed s: the per-seed values of both, the paired t interval (the reading
    rule's, :func:`verdict`), Welch's t interval and the exact permutation p-value with the seed
    as the unit, and, when the runs kept their per-prompt results, the bootstrap over prompts
    and seeds and the one over schema clusters of ``sql_synth/test`` (database and tables) and
    seeds. Also the numbers as a dict (variant → its statistics).

    Raises:
        ValueError: A variant and the control do not hold the same number of seeds, or a run
            has no validation.
    """
    from rllib_dph.evaluation.intervals import (
        cluster_paired_difference_interval,
        paired_difference_interval,
        paired_t_interval,
        permutation_p_value,
        welch_interval,
    )

    def seed_values(runs: list[dict], name: str) -> np.ndarray:
        missing = [i for i, run in enumerate(runs) if "validation" not in run]
        if missing:
            raise ValueError(f"{name}: runs {missing} have no validation; only --max-staleness runs are validated.")
        return np.array([[run["validation"]["pass@1"]] for run in runs])  # (S, 1)

    base = seed_values(control, "the control")
    per_prompt = all("validation_prompts" in run for runs in [*curves.values(), control] for run in runs)
    if per_prompt:
        from reproduce_dph import schema_cluster  # research/reproduce_dph.py
        from rllib_dph.envs.suites import load_split

        base_prompts, ids = _prompt_matrix(control, "the control")
        tasks = {t.id: t for t in load_split(VALIDATION["val_env_config"]["data"])}
        clusters = [schema_cluster(tasks[i]) for i in ids]
    lines = ["| variant | validation pass@1 per seed | control per seed | − control | paired t interval | verdict | "
             "Welch | permutation p" + (" | bootstrap (prompts, seeds) | bootstrap (clusters, seeds) |" if per_prompt else " |"),
             "| --- " * (10 if per_prompt else 8) + "|"]
    numbers = {}
    for name, runs in curves.items():
        values = seed_values(runs, name)
        if len(values) != len(base):
            raise ValueError(f"{name}: {len(values)} seeds against the control's {len(base)}; pair them seed by seed.")
        low, high = paired_t_interval(values, base)
        entry = {"seeds": values[:, 0].tolist(), "control_seeds": base[:, 0].tolist(),
                 "mean": float(values.mean() - base.mean()), "paired_t": [low, high], "verdict": verdict(low, high),
                 "welch": list(welch_interval(values, base)), "permutation_p": permutation_p_value(values, base)}
        if per_prompt:
            prompts, _ = _prompt_matrix(runs, name, ids)
            entry["bootstrap"] = list(paired_difference_interval(prompts, base_prompts))
            entry["cluster_bootstrap"] = list(cluster_paired_difference_interval(prompts, base_prompts, clusters))
            entry["clusters"] = len(set(clusters))
        numbers[name] = entry
        cells = [name, " / ".join(f"{v:.3f}" for v in entry["seeds"]), " / ".join(f"{v:.3f}" for v in entry["control_seeds"]),
                 f"{entry['mean']:+.3f}", f"[{low:+.3f}, {high:+.3f}]", entry["verdict"],
                 "[{:+.3f}, {:+.3f}]".format(*entry["welch"]), f"{entry['permutation_p']:.2f}"]
        if per_prompt:
            cells += ["[{:+.3f}, {:+.3f}]".format(*entry["bootstrap"]),
                      "[{:+.3f}, {:+.3f}] ({} clusters)".format(*entry["cluster_bootstrap"], entry["clusters"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), numbers


def plot(curves: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, runs in curves.items():
        rewards = np.array([run["reward"] for run in runs])
        mean, std = rewards.mean(0), rewards.std(0)
        x = np.arange(1, len(mean) + 1)
        ax.plot(x, mean, label=name)
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("training iteration")
    ax.set_ylabel("training reward (env_runners/reward_mean)")
    ax.set_title("Trust regions on the tiny SQL suite")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2,
                        help="runs at once, each in its own process with one torch thread")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--model", default=None, help="override model_name (default tiny-sql-math)")
    parser.add_argument("--target", type=float, default=None,
                        help="reward target for 'steps to target' (default: mean reward of the first 5 iterations + 0.1)")
    parser.add_argument("--out", default=str(REPO / "research/out"))
    parser.add_argument("--mask-cost-only", action="store_true")
    parser.add_argument("--max-staleness", type=int, default=None,
                        help="sample from one remote env runner with this staleness bound; 0 is the synchronous "
                        "control of that regime (see the module doc); default: the off-policy regime")
    parser.add_argument("--skip-mask-cost", action="store_true")
    parser.add_argument("--variants", nargs="+", default=None, help="run only these variants (names as in the table)")
    parser.add_argument("--config", default="{}",
                        help="config overrides of the regime, under every variant's own (JSON), e.g. a larger lr")
    parser.add_argument("--control", default=None,
                        help="the trust_region.json of the synchronous control (--max-staleness 0) of the same "
                        "regime and seeds: also print each variant's validation pass@1 against it, seed by seed")
    parser.add_argument("--read", default=None,
                        help="a trust_region.json written before: read its runs instead of training (with --control: "
                        "its statistics against the control)")
    args = parser.parse_args()
    control = json.loads(pathlib.Path(args.control).read_text())["curves"]["none"] if args.control else None
    if args.read:
        recorded = json.loads(pathlib.Path(args.read).read_text())
        if control is None:
            raise SystemExit("--read needs --control: the runs' table was written beside them (trust_region.md).")
        table, _ = control_statistics(recorded["curves"], control)
        print(table)
        return
    extra = json.loads(args.config)

    import ray

    ray.init(include_dashboard=False, log_to_driver=False)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    shares = {} if args.skip_mask_cost else mask_cost(args.model)
    if shares:
        print(f"\nmask cost on one batch (learner update {shares['learner_update_s']:.2f} s):")
        for kind in MASK_KINDS:
            print(f"  {kind:<14} {100 * shares[kind]:6.2f} % of the update")
    if args.mask_cost_only:
        return

    variants = VARIANTS if args.max_staleness is None else {**VARIANTS, **ASYNC_VARIANTS}
    if args.variants:
        unknown = set(args.variants) - set(variants)
        if unknown:
            raise SystemExit(f"--variants {sorted(unknown)}: not among {sorted(variants)}")
        variants = {name: variants[name] for name in args.variants}
    with worker_pool(args.workers) as pool:
        futures = {
            name: [pool.submit(train_curves, name, ov, s, args.iterations, args.model, args.max_staleness, extra)
                   for s in args.seeds]
            for name, ov in variants.items()
        }
        curves = {name: [f.result() for f in runs] for name, runs in futures.items()}
    first = np.mean([run["reward"][:5] for runs in curves.values() for run in runs])
    target = args.target if args.target is not None else first + 0.1
    regime = (f"asynchronous, max_staleness={args.max_staleness}, 1 env runner, one optimizer step per batch"
              if args.max_staleness is not None else f"off-policy: {OFF_POLICY}") + (f", {extra}" if extra else "")
    lines = [
        f"Tiny SQL suite, {regime}, {args.iterations} iterations, seeds {args.seeds}; target reward {target:.3f}.",
        "Means over seeds (± std over seeds); per-iteration quantities averaged over all iterations.",
        "",
        "| variant | reward, last 5 iterations | steps to target | mean abs(pi - mu) | masked fraction | "
        "approx KL to mu | bad-update fraction | validation pass@1 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in curves.items():
        final = [np.mean(run["reward"][-5:]) for run in runs]
        steps = [steps_to(run["reward"], target) for run in runs]
        means = {k: np.mean([np.mean(run[k]) for run in runs]) for k in
                 ("abs_prob_diff", "masked_fraction", "approx_kl", "bad_update_fraction")}
        val = [run["validation"]["pass@1"] for run in runs if "validation" in run]
        val_cell = f"{np.mean(val):.3f} ± {np.std(val):.3f}" if val else "-"
        lines.append(
            f"| {name} | {np.mean(final):.3f} ± {np.std(final):.3f} | {np.mean(steps):.1f} | "
            f"{means['abs_prob_diff']:.2e} | {means['masked_fraction']:.4f} | {means['approx_kl']:.2e} | "
            f"{means['bad_update_fraction']:.4f} | {val_cell} |"
        )
    if shares:
        lines += ["", "Mask cost as a share of the learner update time (one batch):", ""]
        lines += [f"- {kind}: {100 * shares[kind]:.2f} %" for kind in MASK_KINDS]
    against_control = {}
    if control is not None:
        control_table, against_control = control_statistics(curves, control)
        lines += ["", "Validation pass@1 against the synchronous control (--control), seed s against seed s:", "",
                  control_table]
    table = "\n".join(lines)
    print("\n" + table)
    (out / "trust_region.md").write_text(table + "\n")
    (out / "trust_region.json").write_text(json.dumps({"curves": curves, "mask_cost": shares, "target": target,
                                                       "against_control": against_control, "args": vars(args)},
                                                      indent=1))
    plot(curves, out / "trust_region.png")
    print(f"\nwrote {out / 'trust_region.md'}, {out / 'trust_region.json'}, {out / 'trust_region.png'}")


if __name__ == "__main__":
    main()
