"""GRPO on reasoning-gym's countdown with the tiny model's countdown warm start (`tiny-countdown-long`).

How to run:
    pip install -e ".[reasoning-gym]"
    rllib train file tuned_examples/grpo/countdown_tiny_grpo.py
    python tuned_examples/grpo/countdown_tiny_grpo.py --stop '{"training_iteration": 5}'

    # pass@k and the solution shapes of a checkpoint on the 300 test puzzles:
    rllib evaluate <checkpoint> --env rllib_dph/ReasoningGym-v0 --env-config '{"dataset": "countdown",
        "config": {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 20, "min_target": 1,
        "max_target": 100}, "size": 300, "seed": 0, "split": "test", "train_size": 2000}' --n 64 --max-new-tokens 48

`tiny-countdown-long` is the bundled tiny model taught countdown by SFT on solver-written
solutions of several shapes per puzzle, 3,400 steps in two stages (rllib_dph.models.build.warm_start;
built on first use, `rllib build-model tiny-countdown-long`, about 70 minutes on 2 cores). Its
base model solves 6.7 % of its samples on the 300 test puzzles (pass@64 77.0 %). The puzzles,
prompts and scorer are reasoning-gym's (rllib_dph.envs.countdown.TINY_COUNTDOWN: 3 numbers of
1-20, targets 1-100, the 2,000 train puzzles of seed 0). This is the GRPO arm of
`research/reproduce_dph.py --budget countdown` and `--budget countdown-collapse`, with the same
settings (tests/test_countdown_examples.py): the SQL tuned example's batch and learning rate
(16 puzzles x 8, lr 3e-4), 100 iterations.

Every 20 iterations it validates on the first 100 of the 300 test puzzles (8 samples and a greedy
one each: ``evaluation/pass@1``, ``evaluation/pass@8``, ... in the results).

Results to expect (seed 0, 2 CPU cores; docs/results/countdown.md, "The tuned examples on the
third recipe: results"):
    100 iterations in 545 s of training time. Validation pass@8 35 % (base) -> 23-33 % -> 25 %
    at iteration 100. On the 300 test puzzles (n = 64) pass@1 7.3 % [6.2, 8.7] (base 6.7; after -
    before +0.7 [-0.3, +1.6]), pass@64 61.3 % [56.0, 66.7] (base 77.0; -15.7 [-20.7, -11.0]):
    GRPO loses pass@k at k >= 8. The shapes narrow (170 -> 107 distinct, 5.73 -> 4.14 bits,
    96.8 % without parentheses).
"""

from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.envs.countdown import TINY_COUNTDOWN

#: The held-out puzzles: the env's 300 test puzzles, none a training question (``data`` None:
#: the whole split, not a training subset such as DPH's D_exp file).
VALIDATION = TINY_COUNTDOWN.env_config(split="test", size=300, train_size=TINY_COUNTDOWN.size, data=None)

config = (
    GRPOConfig()
    .environment("rllib_dph/ReasoningGym-v0", env_config=TINY_COUNTDOWN.env_config())
    .llm(model_name="tiny-countdown-long", temperature=1.0, max_response_length=48)
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
    .held_out(val_interval=20, val_env_config=VALIDATION, val_n=8, val_limit=100)
    .debugging(seed=0)
)

stop = {"training_iteration": 100, "time_total_s": 1800}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
