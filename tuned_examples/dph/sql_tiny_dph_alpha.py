"""DPH with the alpha-divergence (α = 0.5) on the bundled text-to-SQL suite with the tiny base model.

How to run:
    rllib train file tuned_examples/dph/sql_tiny_dph_alpha.py
    python tuned_examples/dph/sql_tiny_dph_alpha.py --stop '{"training_iteration": 5}'

The first run pre-samples the training prompts into $RLLIB_DPH_HOME/presample/sql_tiny_k8 (k = 8,
D_pef = at least 7 correct, then one refinement sample; about a minute on 2 CPU cores); training
mixes 1 stored D_pef row per 8 exploration rows into every update, with no reference model.
Base model, budget and seed of tuned_examples/grpo/sql_tiny_grpo.py; η = 0.01, clip-higher 0.28
and dynamic sampling as in the paper's Table 6, η meaning what it means in the paper's code
(pef_loss_normalization="original": docs/algorithms.md, "DPH-RL").

Results to expect:
    After 100 iterations, 3 seeds (research/reproduce_dph.py, tiny model build 3): greedy
    accuracy 75.1 % (base 69.3, GRPO 74.1), pass@1 65.8 % (base 54.3, GRPO 63.2) on
    sql_synth/test (docs/results/ordinary-suite.md). Not re-measured with the shipped build 4.
"""

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
        divergence="alpha",
        alpha=0.5,
        pef_coeff=0.01,
        pef_loss_normalization="original",  # η as in the paper's code (see docstring)
        pef_ratio=8,
        presample={"out_dir": str(home() / "presample" / "sql_tiny_k8")},
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 100, "time_total_s": 600}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
