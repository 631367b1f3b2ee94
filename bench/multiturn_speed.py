"""Generation tokens/s of multi-turn rollouts against single-turn ones, interleaved.

How to run::

    nice -n 15 python bench/multiturn_speed.py --out docs/multiturn_runs/2026-11-26-tiny-speed.json

On a machine shared with other jobs, tokens/s swings with the load, so the two kinds of rollout
alternate in short rounds, both see the same load, and the ratio per round is reported. The budget, fixed before the run:
``tiny-sql-math-mt``, the first 16 prompts of ``sql_synth/test``, n = 8 episodes per prompt,
temperature 1.0, 96 new tokens per turn, seed 0 + round, HF engine on the CPU, one torch thread;
10 rounds, each one ``rollout`` on ``rllib_dph/SQL-v0`` and one on ``rllib_dph/SQLMultiTurn-v0``
(``max_turns=3``), in alternating order (odd rounds multi-turn first). tokens/s is the tokens the
policy generated (every turn) over the seconds in ``engine.generate``; ``generate`` calls and
the rows they held are counted too (later turns re-encode the whole episode so far, prefill
without a prefix cache in the HF engine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rllib_dph.engines import make_engine
from rllib_dph.engines.base import SamplingParams
from rllib_dph.envs import make_env
from rllib_dph.files import write_json_atomic
from rllib_dph.rollout.episodes import rollout

ENVS = {"single": ("rllib_dph/SQL-v0", {}), "multi": ("rllib_dph/SQLMultiTurn-v0", {"max_turns": 3})}


class TimedEngine:
    """A rollout engine that counts the tokens it generates, its ``generate`` calls and their rows,
    and the seconds it spends generating."""

    def __init__(self, engine):
        self.engine, self.tokens, self.calls, self.rows, self.seconds = engine, 0, 0, 0, 0.0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params):
        start = time.perf_counter()
        groups = self.engine.generate(prompts, params)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.rows += sum(len(g) for g in groups)
        self.tokens += sum(len(c.token_ids) for group in groups for c in group)
        return groups


def one_rollout(engine, env, params: SamplingParams, prompts: int) -> dict:
    counting = TimedEngine(engine)
    result = rollout(counting, env, list(range(prompts)), params)
    episodes = [int(t) for g in result.groups for t in g.turns]
    return {"tokens": counting.tokens, "seconds": counting.seconds, "calls": counting.calls, "rows": counting.rows,
            "tokens_per_s": counting.tokens / counting.seconds, "turns_per_episode": sum(episodes) / len(episodes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default="tiny-sql-math-mt")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = make_engine("hf", args.policy)
    envs = {kind: make_env(env_id, {"data": "sql_synth/test", **cfg}) for kind, (env_id, cfg) in ENVS.items()}
    rounds = []
    for r in range(args.rounds):
        params = SamplingParams(n=8, max_new_tokens=96, seed=r)
        order = ("multi", "single") if r % 2 else ("single", "multi")
        rounds.append({kind: one_rollout(engine, envs[kind], params, args.prompts) for kind in order})
        ratio = rounds[-1]["multi"]["tokens_per_s"] / rounds[-1]["single"]["tokens_per_s"]
        print(f"round {r}: single {rounds[-1]['single']['tokens_per_s']:.0f} tok/s, "
              f"multi {rounds[-1]['multi']['tokens_per_s']:.0f} tok/s, ratio {ratio:.2f}", flush=True)
    ratios = [x["multi"]["tokens_per_s"] / x["single"]["tokens_per_s"] for x in rounds]
    summary = {kind: {key: statistics.median(x[kind][key] for x in rounds)
                      for key in ("tokens_per_s", "tokens", "seconds", "calls", "rows", "turns_per_episode")}
               for kind in ENVS}
    summary["ratio_median"], summary["ratio_min"], summary["ratio_max"] = statistics.median(ratios), min(ratios), max(ratios)
    print({k: v for k, v in summary.items()})
    if args.out:
        settings = {"policy": args.policy, "rounds": args.rounds, "prompts": args.prompts, "n": 8,
                    "max_new_tokens": 96, "date": time.strftime("%Y-%m-%d"), "threads": 1, "torch": torch.__version__}
        write_json_atomic(args.out, {"settings": settings, "summary": summary, "rounds": rounds}, indent=1)


if __name__ == "__main__":
    main()
