"""A Ray Tune sweep over η (the D_pef weight) for DPH-JS on the tiny SQL suite.

How to run:
    rllib train file tuned_examples/dph/sql_tiny_dph_js_eta_sweep.py
    python tuned_examples/dph/sql_tiny_dph_js_eta_sweep.py --stop '{"training_iteration": 3}'

Three trials (η = 0.2, the paper's value, and 10 and 50 times it; η as in the paper's code,
docs/algorithms.md, "DPH-RL") run one after another on 2 CPU cores and share one pre-sampling
folder. Every 5 iterations each trial measures pass@k on the first 50 prompts of the held-out
split (n = 8); at the end the best trial by the last validation pass@8 is printed, with the
trials that tie with it and each trial's validation style entropy (what a larger η keeps).

Why this grid: at 100 iterations η = 0.2 keeps none of the SQL styles that GRPO drops, η = 2 a
little, and η = 10 keeps them near the base model's mix (style entropy 2.17 bits, GRPO 1.69,
base 2.32) with pass@1 level with GRPO's (docs/results/pef-styles.md, "Result").

Results to expect:
    This sweep's own 20-iteration output has not been measured.
"""


from ray import tune

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.files import home

config = (
    DPHConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
    .llm(model_name="tiny-sql-math", temperature=1.0, max_response_length=64)
    .training(
        group_size=8,
        prompts_per_step=16,
        lr=3e-4,
        loss_agg_mode="token-mean",
        trust_region={"kind": "ppo", "high": 0.28},
        dynamic_sampling=True,
    )
    .dph(
        divergence="js",
        pef_coeff=tune.grid_search([0.2, 2.0, 10.0]),
        pef_loss_normalization="original",  # η as in the paper's code (see docstring)
        presample={
            "out_dir": str(home() / "presample" / "sql_tiny_k8_all"),
            "min_correct": 8,  # "8 of 8", all 8 trajectories kept (paper §6.2)
            "pef_samples": "all",
        },
    )
    .held_out(val_env_config={"data": "sql_synth/test"}, val_interval=5, val_n=8, val_limit=50)
    .debugging(seed=0)
)

stop = {"training_iteration": 20, "time_total_s": 300}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
