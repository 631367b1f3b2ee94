"""Does the tiny model use the multi-turn protocol after its SFT? Single-turn vs multi-turn.

How to run::

    nice -n 15 python research/multiturn_eval.py --out docs/multiturn_runs/eval.json

The budget, fixed before the first run:

- policies: ``tiny-sql-math`` as shipped (before) and the ``tiny-sql-math-mt`` warm start
  (after: ``tiny-sql-math`` + 800 SFT steps of 16 examples, half single-turn answers and half
  ``SQLMultiTurn-v0`` traces, ``rllib_dph.models.build.warm_start``); built on first use (~4 min);
- splits: the first 100 prompts of ``sql_synth/test`` (in-domain databases) and of
  ``sql_synth/test_cross`` (databases of domains never trained on);
- envs: ``rllib_dph/SQL-v0`` (single turn) and ``rllib_dph/SQLMultiTurn-v0`` with
  ``max_turns`` 1, 2 and 3 (the prompt states the budget; a query in the last turn ends the
  episode with reward 0);
- sampling: n = 8 episodes per prompt, temperature 1.0, top-p 1.0, 96 new tokens per turn, seed
  0, no greedy pass (``EvalSettings(sampling=SamplingParams(n=8, max_new_tokens=96, seed=0),
  limit=100, greedy=False)``); HF engine on the CPU, one torch thread (the machine is shared).

Reported per row: pass@1 and pass@8 with 95 % bootstrap intervals over prompts
(``EvalResult.intervals``), the paired difference of pass@1 against the same policy's
``SQL-v0`` row on the same prompts (``intervals.paired_difference_interval``), turns per
episode, the share of episodes with an exploratory query, the share of correct episodes among
those with a query and among those without, and generation tokens/s: the tokens
the policy generated (every turn; observations are not generated) over the seconds spent in
``engine.generate`` (later turns re-encode the whole episode so far: that prefill is the cost
of a turn). A table is printed; ``--out`` writes every row's summary, intervals and timing as
JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from rllib_dph.engines.base import SamplingParams
from rllib_dph.envs import make_env
from rllib_dph.evaluation.intervals import paired_difference_interval
from rllib_dph.evaluation.runner import EvalSettings, evaluate_engine, load_engine
from rllib_dph.files import write_json_atomic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from multiturn_speed import TimedEngine  # noqa: E402  bench/multiturn_speed.py

POLICIES = ("tiny-sql-math", "tiny-sql-math-mt")
SPLITS = ("sql_synth/test", "sql_synth/test_cross")
#: (label, env id, env config) of each row; None max_turns: the single-turn env.
ENVS = (("SQL-v0", "rllib_dph/SQL-v0", {}),) + tuple(
    (f"MultiTurn max_turns={t}", "rllib_dph/SQLMultiTurn-v0", {"max_turns": t}) for t in (1, 2, 3)
)


def evaluate_row(engine, split: str, env_id: str, env_config: dict, settings: EvalSettings):
    """One row: the evaluation result and the engine's generation tokens and seconds for it."""
    timed = TimedEngine(engine)
    env = make_env(env_id, {"data": split, **env_config})
    try:
        result = evaluate_engine(timed, env, settings)
    finally:
        env.close()
    return result, timed.tokens, timed.seconds


def row_summary(result, tokens: int, seconds: float, baseline) -> dict:
    """The printed and saved numbers of one row (``baseline``: the policy's SQL-v0 result)."""
    s, iv = result.summary(), result.intervals()
    k = result.n
    row = {
        "pass@1": s["pass@1"], "pass@1_95": list(iv["pass@1"]),
        f"pass@{k}": s[f"pass@{k}"], f"pass@{k}_95": list(iv[f"pass@{k}"]),
        "turns_per_episode": s["turns_per_episode"], "tool_use_share": s["tool_use_share"],
        **accuracy_by_query(result),
        "generated_tokens": tokens, "generate_seconds": round(seconds, 2),
        "tokens_per_s": tokens / seconds if seconds else float("nan"),
        "duration_s": round(result.duration_s, 2),
    }
    if baseline is not None:
        row["delta_pass@1_vs_sql_v0"] = s["pass@1"] - baseline.summary()["pass@1"]
        row["delta_pass@1_95"] = list(paired_difference_interval(result.pass_at(1), baseline.pass_at(1)))
    return row


def accuracy_by_query(result) -> dict:
    """Share of correct episodes among those with an exploratory query and among those without
    (None where there are none), over all prompts' episodes."""
    pairs = [(c, q > 0) for r in result.records for c, q in zip(r.correct, r.tool_calls)]
    out = {}
    for key, with_query in (("accuracy_with_query", True), ("accuracy_without_query", False)):
        chosen = [c for c, q in pairs if q == with_query]
        out[key] = sum(chosen) / len(chosen) if chosen else None
    return out


def format_row(policy: str, split: str, label: str, r: dict, k: int) -> str:
    def ci(name):
        lo, hi = r[f"{name}_95"]
        return f"{r[name]:.2f} [{lo:.2f}, {hi:.2f}]"

    delta = "" if "delta_pass@1_95" not in r else (
        f"{r['delta_pass@1_vs_sql_v0']:+.2f} [{r['delta_pass@1_95'][0]:+.2f}, {r['delta_pass@1_95'][1]:+.2f}]")
    split_by = " / ".join("–" if r[key] is None else f"{r[key]:.2f}"
                          for key in ("accuracy_with_query", "accuracy_without_query"))
    return (f"| {policy} | {split} | {label} | {ci('pass@1')} | {ci(f'pass@{k}')} | {delta} | "
            f"{r['turns_per_episode']:.2f} | {r['tool_use_share']:.2f} | {split_by} | {r['tokens_per_s']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default=",".join(POLICIES), help="Comma-separated model names, folders or RLlib checkpoints.")
    parser.add_argument("--limit", type=int, default=100, help="First prompts of each split.")
    parser.add_argument("--n", type=int, default=8, help="Episodes per prompt.")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="New tokens per turn.")
    parser.add_argument("--threads", type=int, default=1, help="Torch threads.")
    parser.add_argument("--out", default=None, help="JSON file for every row.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = EvalSettings(sampling=SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, seed=0),
                            limit=args.limit, greedy=False)
    print(f"| policy | split | env | pass@1 [95 %] | pass@{args.n} [95 %] | Δ pass@1 vs SQL-v0 [95 %] | "
          "turns/episode | episodes with a query | accuracy with / without a query | gen tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for policy in args.policies.split(","):
        engine = load_engine(policy)
        for split in SPLITS:
            baseline = None
            for label, env_id, env_config in ENVS:
                result, tokens, seconds = evaluate_row(engine, split, env_id, env_config, settings)
                row = row_summary(result, tokens, seconds, baseline)
                baseline = baseline or result
                print(format_row(policy, split, label, row, args.n), flush=True)
                rows.append({"policy": policy, "split": split, "env": label, "env_id": env_id,
                             "env_config": env_config, **row})
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%d"), "limit": args.limit, "n": args.n, "temperature": 1.0,
                "max_new_tokens": args.max_new_tokens, "seed": 0, "threads": args.threads, "engine": "hf (CPU)",
                "torch": torch.__version__}
        write_json_atomic(Path(args.out), {"settings": meta, "rows": rows}, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
