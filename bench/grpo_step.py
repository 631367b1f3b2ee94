"""Where the time of one GRPO training step goes: generation, scoring, learner update, weight sync.

Runs the tiny tuned example (tuned_examples/grpo/sql_tiny_grpo.py) for a warm-up iteration and
then `--iterations` measured ones, and prints seconds and shares per phase, read from the
algorithm's per-step phase times (`step_times/*`) and env-runner metrics. Then it measures the
floor of the same step on the last iteration's batch — generation + scoring (as measured) + one
plain forward/backward/Adam step of the same model on the same rows (the LM head on response
tokens only, loss −Â·log π) — and prints `step / floor`.

    python bench/grpo_step.py                      # tiny-sql-math, the tuned example's settings
    python bench/grpo_step.py --model tiny-random --iterations 2
"""

import argparse
import json
import pathlib
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", default=str(REPO / "tuned_examples/grpo/sql_tiny_grpo.py"))
    parser.add_argument("--model", default=None, help="override model_name (default: the example's)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--config", default="{}", help="more config overrides as JSON")
    args = parser.parse_args()

    import ray

    from rllib_dph.cli.experiments import load_tuned_example

    config, _ = load_tuned_example(args.example)
    overrides = json.loads(args.config)
    if args.model:
        overrides["model_name"] = args.model
    config.update_from_dict(overrides)
    ray.init(include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    algo.train()  # warm-up: first-call overheads (allocations, caches)
    batches = []
    build = algo.build_train_batch
    algo.build_train_batch = lambda: batches.append(build()) or batches[-1]

    phases = {"generation": [], "scoring": [], "batch + advantages": [], "learner update": [], "weight sync": []}
    totals, tokens = [], []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        result = algo.train()
        totals.append(time.perf_counter() - t0)
        runners, times = result["env_runners"], result["step_times"]
        phases["generation"].append(runners["generation_time_s"])
        phases["scoring"].append(runners["scoring_time_s"])
        phases["batch + advantages"].append(
            times["sampling_s"] - runners["generation_time_s"] - runners["scoring_time_s"]
        )
        phases["learner update"].append(times["learner_update_s"])
        phases["weight sync"].append(times["weight_sync_s"])
        tokens.append(runners["generation_tokens_per_s"])
    algo.stop()

    step = float(np.mean(totals))
    rows = config.prompts_per_step * config.group_size
    print(f"\nGRPO step on {config.model_name}: {config.prompts_per_step} prompts x {config.group_size} "
          f"completions = {rows} rows, max {config.max_response_length} new tokens; "
          f"mean of {args.iterations} iterations after 1 warm-up")
    print(f"{'phase':<22}{'seconds':>10}{'share':>9}")
    for name, values in phases.items():
        sec = float(np.mean(values))
        print(f"{name:<22}{sec:>10.2f}{100 * sec / step:>8.1f}%")
    other = step - sum(float(np.mean(v)) for v in phases.values())
    print(f"{'other (driver, metrics)':<22}{other:>10.2f}{100 * other / step:>8.1f}%")
    print(f"{'total':<22}{step:>10.2f}{100.0:>8.1f}%")
    print(f"generation throughput: {np.mean(tokens):.0f} tokens/s")

    update = plain_update_seconds(config, batches[-1])
    floor = float(np.mean(phases["generation"]) + np.mean(phases["scoring"])) + update
    print(f"floor: generation + scoring + plain fwd/bwd/Adam ({update:.2f} s) = {floor:.2f} s; "
          f"step / floor = {step / floor:.2f}")


def plain_update_seconds(config, batch: dict, repeats: int = 3) -> float:
    """Median seconds of one plain training step on ``batch``: forward, the LM head on the
    response tokens only, loss −Â·log π averaged over them, backward, Adam."""
    import torch

    from rllib_dph import columns as C
    from rllib_dph.models.hub import load_causal_lm

    model = load_causal_lm(config.model_name, dtype=torch.float32).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    ids = torch.as_tensor(batch[C.INPUT_IDS])
    mask = torch.as_tensor(batch[C.ATTENTION_MASK])
    where = torch.as_tensor(batch[C.RESPONSE_MASK])[:, 1:].bool()  # (B, L-1)
    advantages = torch.as_tensor(batch[C.ADVANTAGES])[:, None].expand_as(where)[where]  # (N,)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, H)
        logits = model.get_output_embeddings()(hidden[:, :-1][where])  # (N, V)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:][where][:, None]).squeeze(-1)
        loss = -(advantages * logp).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


if __name__ == "__main__":
    main()
