"""DPH-F (forward KL, low-variance generator u - 1 - log u) on the bundled text-to-SQL suite with the tiny base model.

How to run:
    rllib train file tuned_examples/dph/sql_tiny_dph_f.py
    python tuned_examples/dph/sql_tiny_dph_f.py --stop '{"training_iteration": 5}'

The first run pre-samples the training prompts into $RLLIB_DPH_HOME/presample/sql_tiny_k8 (k = 8,
D_pef = at least 7 correct, then one refinement sample; about a minute on 2 CPU cores); training
mixes 1 stored D_pef row per 8 exploration rows into every update, with no reference model.
Base model, budget and seed of tuned_examples/grpo/sql_tiny_grpo.py; η = 0.01, clip-higher 0.28
and dynamic sampling as in the paper's Table 6, η meaning what it means in the paper's code
(pef_loss_normalization="original": docs/algorithms.md, "DPH-RL").

Results to expect:
    After 100 iterations (`python research/reproduce_dph.py --budget ties`: 96-token responses,
    3 seeds, all 300 prompts of sql_synth/test, n = 64): greedy accuracy 73.8 % (base 67.3, GRPO
    73.1), pass@1 63.2 % (base 49.1, GRPO 60.4), pass@64 83.1 % (base 84.0, GRPO 83.1). On the
    held-out ties family pass@64 falls from 49.3 % to 10.6 % (GRPO 11.4 %): every method loses
    the minority approach there (docs/results/ties.md).
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
        divergence="forward_kl",
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
