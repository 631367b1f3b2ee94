"""Asynchronous GRPO: tuned_examples/grpo/sql_tiny_grpo.py with one env runner sampling one step
ahead of the learner (``max_staleness=1``; docs/async.md).

How to run:
    rllib train file tuned_examples/grpo/sql_tiny_grpo_async.py
    python tuned_examples/grpo/sql_tiny_grpo_async.py --stop '{"training_iteration": 5}'

The env runner generates the next step's groups with the weights it has while the learner
updates; every trained row is then one weight version old (`staleness_mean` = 1) and DPPO's
binary-TV trust region, anchored on the rollout policy μ, bounds the update against the policy
that sampled it. `num_stale_rows_dropped` counts rows older than the bound (0 at steady state).

Results to expect:
    0.91 iterations/s against the synchronous loop's 0.61 with one env runner on 2 CPU cores
    (1.51x; `python bench/async_rollouts.py --iterations 5 --learner-threads 1`); validation
    pass@1 at staleness 1 within noise of the synchronous control (docs/results/async.md). This
    example's own learning curve with its DPPO trust region has not been measured.
"""

from rllib_dph.algorithms.grpo import GRPOConfig

config = (
    GRPOConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
    .llm(model_name="tiny-sql-math", temperature=1.0, max_response_length=64)
    .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
    .learners(num_learners=0)
    .training(
        group_size=8,
        prompts_per_step=16,
        lr=3e-4,
        num_epochs=1,
        trust_region="dppo_binary_tv",
        loss_agg_mode="token-mean",
        kl_coeff=0.0,
        max_staleness=1,
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 100, "time_total_s": 600}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
