"""Find GRPO's diversity collapse on the ties family: a documented sweep.

Each setting trains GRPO (`tuned_examples/grpo/sql_tiny_grpo.py` with the overrides below) and
evaluates the policy on the first `--limit` prompts of `sql_synth/test_ties`, where only the
base model's minority approach (`extremum`, `= (SELECT MAX(...))`) is right: `--n` samples per
prompt at temperature 1 and one greedy completion, before training and every `--every`
iterations, with one sampling seed for all (common random numbers; `research/grpo_budget.py` does
the run). A setting *collapses* when pass@k at the largest k falls below the base model's with a
95 % paired interval that excludes 0.

The settings vary the knobs the literature names: updates per batch (the positive control),
learning rate, group size, sampling temperature, training-set size and the share of ties
questions in training. Every setting that was run stays in the table; none is dropped.

    python research/collapse_search.py                          # every setting, n = 64, 100 prompts
    python research/collapse_search.py --settings grpo,epochs4  # some of them
    python research/collapse_search.py --dry-run                # print the commands only
    python research/collapse_search.py --table                  # the table of what has been run
    python research/collapse_search.py --curve                  # pass@64 along training: GRPO and DPH-JS
    python research/collapse_search.py --curve --family nulls   # the same on the NULL family (+ DPH-JS at eta 10)

Writes `research/out/collapse/<setting>/curve.json` (`grpo_budget.py`'s output) and
`research/out/collapse/summary.md`. `--curve` trains the `grpo` and `dph-js` settings for the
comparison's budget (100 iterations), evaluates every 20 iterations
(`research/out/collapse/curves/<setting>/`) and plots pass@64 against iterations
(`docs/results/figures/collapse_curve.png`). `--family nulls` does the same on the NULL family
(docs/results/nulls.md: its budget's model and training mix, `sql_synth/test_nulls`, the settings
`grpo`, `dph-js` and `dph-js-eta10`; `research/out/collapse/nulls/`,
`docs/results/figures/collapse_nulls_curve.png`).
"""

import argparse
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "research/out/collapse"
SPLIT = "sql_synth/test_ties"
#: Each family's test split, config overrides of every setting (as `research/reproduce_dph.py`'s
#: budget of it), output folder and curve figure.
FAMILIES = {
    "ties": dict(split=SPLIT, config={}, out=OUT, png=REPO / "docs/results/figures/collapse_curve.png", curve="grpo,dph-js"),
    "nulls": dict(split="sql_synth/test_nulls", out=OUT / "nulls", png=REPO / "docs/results/figures/collapse_nulls_curve.png",
                  config={"model_name": "tiny-sql-math-nulls", "env_config": {"data": "sql_synth/train@nulls=0.1"}},
                  curve="grpo,dph-js,dph-js-eta10"),
}

#: Overrides of every setting: `extremum` answers run to 74 tokens (`order_limit` to 49), so the
#: tuned example's 64-token limit would cut the robust approach short; 96 cuts neither.
COMMON = {"max_response_length": 96}
GRPO_EXAMPLE = "tuned_examples/grpo/sql_tiny_grpo.py"
#: Settings that train another tuned example than GRPO's.
EXAMPLES = {"dph-js": "tuned_examples/dph/sql_tiny_dph_js.py", "dph-js-eta10": "tuned_examples/dph/sql_tiny_dph_js.py"}
#: name -> (what it tests, config overrides of its tuned example (GRPO's unless in EXAMPLES), on
#: top of COMMON).
SETTINGS: dict[str, tuple[str, dict]] = {
    "grpo": ("the tuned example as it is (the family's training data: for ties, no ties questions)", {}),
    "epochs4": ("positive control: 4 updates per batch (2 mini-batches x 2 epochs), lr 1e-3",
                {"num_epochs": 2, "minibatch_size": 64, "lr": 1e-3}),
    "lr1e-3": ("learning rate 1e-3 (tuned: 3e-4)", {"lr": 1e-3}),
    "group4": ("group size 4 (tuned: 8), 32 prompts per step", {"group_size": 4, "prompts_per_step": 32}),
    "temp0.7": ("sampling temperature 0.7 in training (evaluation stays at 1.0)", {"temperature": 0.7}),
    "small64": ("a small fixed training set: the first 64 training prompts",
                {"env_config": {"data": "sql_synth/train[:64]"}}),
    "ties5": ("5 % ties questions in training", {"env_config": {"data": "sql_synth/train@ties=0.05"}}),
    "ties20": ("20 % ties questions in training", {"env_config": {"data": "sql_synth/train@ties=0.2"}}),
    "dph-js": ("not a GRPO setting: the DPH-JS tuned example (8 of 8, all trajectories), for the curve", {}),
    "dph-js-eta10": ("not a GRPO setting: DPH-JS at 50x the tuned eta, for the NULL family's curve", {"pef_coeff": 10.0}),
}


def out_dir(name: str, args: argparse.Namespace) -> pathlib.Path:
    """Where a setting's run writes: `curves/<name>` for `--curve`, else `<name>` (under the family's folder)."""
    root = FAMILIES[args.family]["out"]
    return root / "curves" / name if args.curve else root / name


def command(name: str, args: argparse.Namespace) -> list[str]:
    """The `grpo_budget.py` command of one setting."""
    _, overrides = SETTINGS[name]
    family = FAMILIES[args.family]
    overrides = {**COMMON, **family["config"], **overrides, **json.loads(args.config)}
    return [sys.executable, str(REPO / "research/grpo_budget.py"), "--example", str(REPO / EXAMPLES.get(name, GRPO_EXAMPLE)),
            "--split", family["split"], "--n", str(args.n),
            "--limit", str(args.limit), "--iterations", str(args.iterations), "--every", str(args.every),
            "--seed", str(args.seed), "--config", json.dumps(overrides),
            "--base-cache", str(family["out"] / "base"), "--out", str(out_dir(name, args))]


def plot_curves(names: list[str], family: str) -> None:
    """pass@k at the largest k (and pass@1) against iterations, with 95 % bands, one line per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in names:
        rows = json.loads((FAMILIES[family]["out"] / "curves" / name / "curve.json").read_text())["rows"]
        k = max_k(rows[-1]["summary"])
        its = [r["iteration"] for r in rows]
        for metric, style in ((f"pass@{k}", "-"), ("pass@1", ":")):
            drawn, = ax.plot(its, [100 * r["summary"][metric] for r in rows], style, marker="o", label=f"{name} {metric}")
            low, high = zip(*(r["intervals"][metric] for r in rows))
            ax.fill_between(its, 100 * np.array(low), 100 * np.array(high), color=drawn.get_color(), alpha=0.12)
    ax.set_ylim(0, 100)
    ax.set_xlabel("training iteration")
    ax.set_ylabel(f"{FAMILIES[family]['split']} (%), 95 % band")
    ax.set_title(f"The {family} family along training (first 100 prompts, n = 64)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FAMILIES[family]["png"], dpi=120)
    plt.close(fig)


def max_k(summary: dict) -> int:
    """The largest k of a summary's overall `pass@k` entries (not the per-style `pass@k/<style>`)."""
    return max(int(m.split("@")[1]) for m in summary if m.startswith("pass@") and "/" not in m)


def table(root: pathlib.Path = OUT) -> str:
    """The markdown table of every setting under ``root`` that has a curve: each evaluation against the base."""
    from rllib_dph.evaluation.intervals import format_interval

    lines = ["| setting | what it tests | iterations | train reward (first 10 → last 10 it.) | pass@1 | pass@k | pass@k − base | collapse |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, (what, _) in SETTINGS.items():
        path = root / name / "curve.json"
        if not path.is_file():
            continue
        curve = json.loads(path.read_text())
        for row in curve["rows"][1:]:
            rewards = curve["train_reward"][: row["iteration"]]
            trend = f"{sum(rewards[:10]) / 10:.2f} → {sum(rewards[-10:]) / 10:.2f}"
            k = max_k(row["summary"])
            s, ci = row["summary"], row["intervals"]
            diff, (low, high) = row[f"pass@{k} - base"]
            cells = [format_interval(s["pass@1"], ci["pass@1"], scale=100),
                     format_interval(s[f"pass@{k}"], ci[f"pass@{k}"], scale=100),
                     format_interval(diff, (low, high), scale=100), "yes" if high < 0 else "no"]
            lines.append(f"| {name} | {what} | {row['iteration']} | {trend} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", help="comma-separated names of SETTINGS (default: all; --curve: grpo,dph-js)")
    parser.add_argument("--curve", action="store_true",
                        help="pass@64 along training: evaluate every 20 of 100 iterations into curves/, "
                             "plot docs/results/figures/collapse_curve.png")
    parser.add_argument("--iterations", type=int, help="default 200 (--curve: 100)")
    parser.add_argument("--every", type=int, help="default 100 (--curve: 20)")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="{}", help="JSON overrides added to every setting")
    parser.add_argument("--family", choices=list(FAMILIES), default="ties", help="the family to evaluate on (default ties)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--table", action="store_true", help="print the table of the runs made, run nothing")
    args = parser.parse_args()
    args.settings = args.settings or (FAMILIES[args.family]["curve"] if args.curve else ",".join(SETTINGS))
    args.iterations = args.iterations or (100 if args.curve else 200)
    args.every = args.every or (20 if args.curve else 100)
    names = [n for n in args.settings.split(",") if n]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; the settings are {list(SETTINGS)}")
    if not args.table:
        for name in names:
            cmd = command(name, args)
            print(" ".join(cmd) if args.dry_run else f"== {name}: {SETTINGS[name][0]}", flush=True)
            if not args.dry_run:
                subprocess.run(cmd, check=True)
    if args.dry_run:
        return
    if args.curve:
        plot_curves(names, args.family)
        print(f"wrote {FAMILIES[args.family]['png']}")
        return
    root = FAMILIES[args.family]["out"]
    summary = table(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "summary.md").write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
