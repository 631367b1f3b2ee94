"""The weight sync of one training step, in its three parts: reading the learner's weights, putting
them into Ray's object store, and loading them into the env runners' engines.

Builds a tuned example (CPU by default), then times ``--repeats`` syncs after a first one (which
also allocates the object store's memory) and prints, per part, the median seconds and the state's
size in MB. The parts are those of ``GRPO._sync_weights``: ``learner_weights()`` (the learner's
``get_state``: a CPU copy of every tensor), ``SamplingRounds.publish`` (``ray.put``) and
``SamplingRounds.push`` (every env runner's ``load_weights``: ``ray.get`` and the engine's
``update_weights``).

    python bench/weight_sync.py                                  # SmolLM2-135M, local env runner, CPU
    python bench/weight_sync.py --config '{"num_env_runners": 1}'   # a remote env runner
    python bench/weight_sync.py --example tuned_examples/grpo/sql_tiny_grpo.py
    # one GPU, the example as shipped (the step "weight-sync" of tools/offline_kit/gpu_suite.py):
    python bench/weight_sync.py --config '{"num_gpus_per_learner": 1, "num_gpus_per_env_runner": 1, "dtype": "bfloat16"}'
"""

import argparse
import json
import pathlib
import statistics
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CPU = {"num_gpus_per_learner": 0, "num_gpus_per_env_runner": 0, "dtype": "float32", "prompts_per_step": 1,
       "group_size": 2, "max_response_length": 8, "minibatch_size": 2}


def state_mb(tree) -> float:
    """Megabytes of the tensors and arrays in a (nested) state dict."""
    import torch

    if isinstance(tree, dict):
        return sum(state_mb(v) for v in tree.values())
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size() / 1e6
    return getattr(tree, "nbytes", 0) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", default=str(REPO / "tuned_examples/grpo/sql_smollm2_grpo.py"))
    parser.add_argument("--config", default="{}", help="overrides on top of the CPU settings (JSON)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the result to this JSON file")
    args = parser.parse_args()

    from rllib_dph.cli.experiments import load_tuned_example

    config, _ = load_tuned_example(args.example)
    config.update_from_dict({**CPU, **json.loads(args.config)})
    algo = config.build_algo()
    parts: dict[str, list[float]] = {"read": [], "publish": [], "push": []}
    size = 0.0
    for i in range(args.repeats + 1):
        t0 = time.perf_counter()
        state = algo.learner_weights()
        t1 = time.perf_counter()
        algo._rounds.publish(state)
        t2 = time.perf_counter()
        algo._rounds.push()
        t3 = time.perf_counter()
        size = state_mb(state)
        if i:  # the first sync also allocates the object store's memory
            for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
                parts[name].append(seconds)
    algo.stop()
    medians = {name: statistics.median(values) for name, values in parts.items()}
    print(f"state {size:.0f} MB; median of {args.repeats}: " + ", ".join(f"{k} {v:.3f} s" for k, v in medians.items())
          + f", total {sum(medians.values()):.3f} s")
    record = {"example": args.example, "config": json.loads(args.config), "state_mb": size, **medians}
    print(json.dumps(record))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
