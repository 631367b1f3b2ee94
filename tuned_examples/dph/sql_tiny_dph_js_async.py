"""Asynchronous DPH-JS: tuned_examples/dph/sql_tiny_dph_js.py with one env runner sampling one
step ahead of the learner (``max_staleness=1``; docs/async.md).

How to run:
    rllib train file tuned_examples/dph/sql_tiny_dph_js_async.py
    python tuned_examples/dph/sql_tiny_dph_js_async.py --stop '{"training_iteration": 5}'

The exploration rows (D_exp) are sampled one weight version behind the learner; the D_pef rows
are added by the learner with their stored π_ref and are never stale. Pre-sampling is the
synchronous example's (same presample.out_dir, reused when present).

Results to expect:
    Not measured; compare with the synchronous example over the same budget.
"""

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.files import home

config = (
    DPHConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
    .llm(model_name="tiny-sql-math", temperature=1.0, max_response_length=64)
    .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
    .training(
        group_size=8,
        prompts_per_step=16,
        lr=3e-4,
        loss_agg_mode="token-mean",
        trust_region={"kind": "ppo", "high": 0.28},
        dynamic_sampling=True,
        max_staleness=1,
    )
    .dph(
        divergence="js",
        pef_coeff=0.2,
        pef_loss_normalization="original",
        pef_ratio=8,
        presample={
            "out_dir": str(home() / "presample" / "sql_tiny_k8_all"),
            "min_correct": 8,
            "pef_samples": "all",
        },
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 100, "time_total_s": 600}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
