"""GRPO on multi-turn text-to-SQL (exploratory queries before the answer) from the multi-turn warm start.

How to run:
    rllib train file tuned_examples/grpo/sql_tiny_multiturn_grpo.py
    python tuned_examples/grpo/sql_tiny_multiturn_grpo.py --stop '{"training_iteration": 5}'

    # Evaluate a checkpoint on held-out questions, with the same protocol and turn budget:
    rllib evaluate <the run's last checkpoint_00000N> --env rllib_dph/SQLMultiTurn-v0 \\
        --env-config '{"data": "sql_synth/test", "max_turns": 3}' --n 8 --max-new-tokens 96 --limit 100

Each episode is one `sql_synth/train` question in `rllib_dph/SQLMultiTurn-v0`: a turn with a
`<query>...</query>` block runs that query read-only and shows its first rows; a turn with a
```sql block is the final answer, scored as in `SQL-v0`; at most 3 policy turns and 96 new
tokens per turn. The policy is `tiny-sql-math-mt`, the shipped tiny model after an SFT on the
env's own episodes (docs/models.md, "Warm start: tiny-sql-math-mt (the multi-turn protocol)"),
built into the cache on first use: the shipped `tiny-sql-math` never writes the protocol, so
every episode would score 0. GRPO groups are a prompt's 8 episodes, one advantage per episode;
observation tokens carry no loss (docs/multiturn.md).

Results to expect:
    About 5 minutes of training for the 40 iterations on 2 CPU cores. The training reward rises
    0.43 -> 0.56 while the share of episodes with a query (`env_runners/tool_use_share`) falls
    0.56 -> 0.00: GRPO drops the protocol. The last checkpoint on the first 100 prompts of
    sql_synth/test (the `rllib evaluate` line above with `--no-greedy`): pass@1 0.52 [0.44, 0.60],
    pass@8 0.73 [0.64, 0.82], against the warm start's pass@1 0.34 (docs/results/multiturn.md).
"""

from rllib_dph.algorithms.grpo import GRPOConfig

config = (
    GRPOConfig()
    .environment("rllib_dph/SQLMultiTurn-v0", env_config={"data": "sql_synth/train", "max_turns": 3})
    .llm(model_name="tiny-sql-math-mt", temperature=1.0, max_response_length=96)
    .env_runners(num_env_runners=0)
    .learners(num_learners=0)
    .training(
        group_size=8,
        prompts_per_step=16,
        lr=3e-4,
        num_epochs=1,
        trust_region={"kind": "ppo", "low": 0.2, "high": 0.2},
        loss_agg_mode="token-mean",
        kl_coeff=0.0,
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 40, "time_total_s": 900}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
