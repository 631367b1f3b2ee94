"""The countdown tuned examples' learning runs (docs/results/countdown.md, "The tuned examples'
learning runs: fixed on 2026-11-28, before they ran"): their learning curves as a figure and their
numbers as Markdown tables.

    python research/countdown_curves.py --base research/out/countdown_base/results.json \\
        --run GRPO=<trial folder> --run "DPH-JS (η=10)"=<trial folder> \\
        --after GRPO=research/out/countdown_grpo_after --after "DPH-JS (η=10)"=research/out/countdown_dph_js_after \\
        --png docs/results/figures/countdown_tuned_grpo_curve.png

A trial folder is the one Tune writes for a run of ``rllib train file`` (its ``result.json`` holds
one JSON line per iteration); an ``--after`` folder is what ``rllib evaluate --baseline`` wrote
(``results.json``, ``compare.json``). The figure has two panels: the training reward per iteration
(``env_runners/reward_mean``, faint, and its moving mean over ``--window`` iterations) and the
held-out validation (``evaluation/pass@1`` and ``evaluation/pass@8`` on the first ``--val-limit``
test puzzles, every ``val_interval`` iterations), whose iteration 0 is the base model's pass@1 and
pass@8 on the same puzzles from its own evaluation (64 samples each). Printed: the curve's numbers,
pass@k before and after with their 95 % bootstrap intervals over puzzles, after − before (paired
over puzzles, from ``compare.json``) and the shapes table (``research/reproduce_dph.py``'s
``shapes_table``).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import numpy as np

from rllib_dph.evaluation import EvalResult
from rllib_dph.evaluation.intervals import format_interval

#: The pass@k of the validation panel (``val_n`` = 8 samples per puzzle).
VAL_KS = (1, 8)


def named(text: str) -> tuple[str, pathlib.Path]:
    """``NAME=PATH`` of ``--run`` and ``--after``, split at the last ``=`` (method names such as
    ``DPH-JS (η=10)`` hold one)."""
    name, sep, path = text.rpartition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=PATH, e.g. GRPO=research/out/countdown_grpo_after")
    return name, pathlib.Path(path)


def read_trial(folder: pathlib.Path) -> list[dict]:
    """The iterations of a Tune trial folder (its ``result.json``, one JSON object a line)."""
    path = folder / "result.json"
    if not path.is_file():
        raise SystemExit(f"countdown_curves: {path} does not exist; --run takes a Tune trial folder (it holds result.json)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curve(rows: list[dict]) -> dict:
    """Training reward per iteration, validation points ``{iteration: {metric: value}}`` and seconds."""
    rewards = [float(row["env_runners"]["reward_mean"]) for row in rows]
    validation = {row["training_iteration"]: row["evaluation"] for row in rows  # (NaN between validations)
                  if math.isfinite(row.get("evaluation", {}).get("pass@1", math.nan))}
    return {"reward": rewards, "validation": validation, "time_total_s": rows[-1]["time_total_s"] if rows else 0.0}


def base_validation(base: EvalResult, limit: int) -> dict[str, float]:
    """The base model's pass@k of :data:`VAL_KS` and greedy accuracy on the first ``limit`` puzzles
    (its own samples)."""
    greedy = [r.greedy_correct for r in base.records[:limit]]
    return {**{f"pass@{k}": float(np.mean(base.pass_at(k)[:limit])) for k in VAL_KS},
            "greedy_accuracy": float(np.mean(greedy)) if None not in greedy else None}


def figure(curves: dict[str, dict], base: dict[str, float], out_png: pathlib.Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, c in curves.items():
        x = np.arange(1, len(c["reward"]) + 1)
        line, = left.plot(x, c["reward"], alpha=0.25)
        if len(x) >= window:
            left.plot(x[window - 1:], np.convolve(c["reward"], np.ones(window) / window, mode="valid"),
                      color=line.get_color(), label=f"{name} (mean of {window})")
        its = [0, *sorted(c["validation"])]
        for k, style in zip(VAL_KS, ("-o", "--s")):
            values = [base[f"pass@{k}"]] + [c["validation"][i][f"pass@{k}"] for i in its[1:]]
            right.plot(its, 100 * np.array(values), style, color=line.get_color(), label=f"{name} pass@{k}")
    left.set_xlabel("iteration")
    left.set_ylabel("training reward (batch mean)")
    left.legend(fontsize=8)
    right.set_xlabel("iteration (0: the base model)")
    right.set_ylabel("validation pass@k (%)")
    right.legend(fontsize=8)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)


def curve_table(curves: dict[str, dict], base: dict[str, float], interval: int) -> str:
    """Per run and validation point: the mean training reward of the iterations since the last
    point, validation pass@1, pass@8 and greedy accuracy (%)."""
    lines = ["| run | iteration | training reward (mean since the last point) | pass@1 | pass@8 | greedy |",
             "| --- | --- | --- | --- | --- | --- |"]
    def cells(ev: dict) -> str:
        greedy = ev.get("greedy_accuracy")
        return (f"{100 * ev['pass@1']:.2f} | {100 * ev['pass@8']:.1f} | "
                f"{'—' if greedy is None else f'{100 * greedy:.1f}'} |")

    lines.append(f"| base model | 0 | — | {cells(base)}")
    for name, c in curves.items():
        for it, ev in sorted(c["validation"].items()):
            lines.append(f"| {name} | {it} | {np.mean(c['reward'][max(0, it - interval):it]):.3f} | {cells(ev)}")
    return "\n".join(lines)


def stored(folder_or_file: pathlib.Path) -> dict:
    """A results.json as written (summary and the intervals computed when it was written)."""
    path = folder_or_file / "results.json" if folder_or_file.is_dir() else folder_or_file
    return json.loads(path.read_text())


def pass_table(rows: list[tuple[str, dict]]) -> str:
    """Greedy, pass@k and distinct correct@n, each with its stored 95 % interval."""
    n = rows[0][1]["summary"]["n"]
    ks = rows[0][1]["settings"]["ks"]
    cols = ["greedy_accuracy"] + [f"pass@{k}" for k in ks]
    head = ["greedy"] + [f"pass@{k}" for k in ks] + [f"distinct correct@{n}"]
    lines = [f"| 300 puzzles, n = {n} | " + " | ".join(head) + " |", "|" + " --- |" * (len(head) + 1)]
    for name, data in rows:
        s, ci = data["summary"], data["intervals_95"]
        cells = [format_interval(s[c], ci.get(c), scale=100, digits=2 if c == "pass@1" else 1) for c in cols]
        cells.append(format_interval(s[f"distinct_correct@{n}"], ci.get(f"distinct_correct@{n}"), digits=2))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def signed(value, interval, scale: float = 1.0, digits: int = 1) -> str:
    """A difference and its interval with signs: ``"+0.8 [-1.1, +2.7]"`` (0 unsigned)."""
    if value is None or not math.isfinite(value):
        return "—"

    def text(x: float) -> str:
        x = round(scale * x, digits)
        return f"{x:+.{digits}f}" if x else f"{0:.{digits}f}"

    return f"{text(value)} [{text(interval[0])}, {text(interval[1])}]"


def difference_table(afters: dict[str, pathlib.Path]) -> str:
    """pass@k after − before per k (points, paired bootstrap over puzzles), and distinct correct."""
    comparisons = {name: json.loads((folder / "compare.json").read_text())["by_k"] for name, folder in afters.items()}
    ks = sorted({int(k) for c in comparisons.values() for k in c})
    lines = ["| after − before (points) | " + " | ".join(f"pass@{k}" for k in ks) + f" | distinct correct@{ks[-1]} |",
             "|" + " --- |" * (len(ks) + 2)]
    for name, by_k in comparisons.items():
        cells = [signed(by_k[str(k)]["pass_diff"], by_k[str(k)]["pass_diff_ci"], scale=100) for k in ks]
        last = by_k[str(ks[-1])]
        cells.append(signed(last.get("distinct_correct_diff"), last.get("distinct_correct_diff_ci"), digits=2))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shapes(base: EvalResult, afters: dict[str, pathlib.Path]) -> str:
    import reproduce_dph  # the neighbouring script (its folder is on sys.path when this one runs)

    runs = {name: [{"countdown": EvalResult.from_json(folder / "results.json")}] for name, folder in afters.items()}
    return reproduce_dph.shapes_table({"countdown": base}, runs)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=pathlib.Path, required=True, help="the base model's results.json")
    parser.add_argument("--run", type=named, action="append", default=[], help="NAME=Tune trial folder (repeatable)")
    parser.add_argument("--after", type=named, action="append", default=[],
                        help="NAME=folder of `rllib evaluate --baseline` on the run's final checkpoint (repeatable)")
    parser.add_argument("--png", type=pathlib.Path, help="where the figure goes")
    parser.add_argument("--val-limit", type=int, default=100, help="the validation puzzles (the first N of the split)")
    parser.add_argument("--val-interval", type=int, default=20, help="iterations between validation points")
    parser.add_argument("--window", type=int, default=5, help="moving mean of the training reward")
    args = parser.parse_args()

    base = EvalResult.from_json(args.base)
    curves = {name: curve(read_trial(folder)) for name, folder in args.run}
    if curves:
        start = base_validation(base, args.val_limit)
        if args.png:
            figure(curves, start, args.png, args.window)
            print(f"wrote {args.png}")
        print(curve_table(curves, start, args.val_interval), "\n")
        for name, c in curves.items():
            print(f"{name}: {len(c['reward'])} iterations, {c['time_total_s']:.0f} s of training time")
        print()
    afters = dict(args.after)
    if afters:
        print(pass_table([("Base model", stored(args.base))] + [(name, stored(f)) for name, f in afters.items()]), "\n")
        print(difference_table(afters), "\n")
        print(shapes(base, afters))


if __name__ == "__main__":
    main()
