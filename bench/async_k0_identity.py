"""Prints the per-iteration numbers of 3 seeded GRPO iterations (1 remote env runner) so that two
code versions can be compared: with max_staleness=0 (the default) they must be equal to the loop
before asynchronous sampling (docs/async.md, "Measurements").

The model is the shipped ``tiny-sql-math`` (the same weights in both versions), which solves some
prompts: its updates are not zero, so equal numbers mean the same batches and the same updates.
``--model tiny-random`` solves none (every advantage, loss and update is 0): only the sampling is
compared then.

    PYTHONPATH=/tmp/async_base python bench/async_k0_identity.py   # commit e5d19a1, unpacked
    PYTHONPATH=$PWD python bench/async_k0_identity.py
"""
import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-sql-math")
    args = parser.parse_args()
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_dph.algorithms.grpo import GRPOConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name=args.model, max_response_length=64)
        .training(group_size=4, prompts_per_step=4, lr=1e-3, minibatch_size=8)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    out = []
    for _ in range(3):
        r = algo.train()
        learner = r["learners"][DEFAULT_MODULE_ID]
        out.append({k: learner[k] for k in ("policy_loss", "grad_norm", "abs_prob_diff_max") if k in learner}
                   | {"reward_mean": r["env_runners"]["reward_mean"], "response_length_mean": r["env_runners"]["response_length_mean"]})
    print("RESULT", json.dumps(out))
    algo.stop()


if __name__ == "__main__":
    main()
