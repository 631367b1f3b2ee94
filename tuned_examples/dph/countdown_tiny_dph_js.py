"""DPH-JS (eta = 10) on reasoning-gym's countdown with the tiny model's countdown warm start.

How to run:
    pip install -e ".[reasoning-gym]"
    rllib train file tuned_examples/dph/countdown_tiny_dph_js.py
    python tuned_examples/dph/countdown_tiny_dph_js.py --stop '{"training_iteration": 5}'

The first run pre-samples the 2,000 train puzzles (k = 8 each) with `tiny-countdown-long` into
$RLLIB_DPH_HOME/presample/countdown_tiny_long_k8_all: D_pef is the puzzles solved 8 of 8, all 8
trajectories kept (the paper's recommended recipe), D_exp the rest. Then GRPO on D_exp with the
Jensen-Shannon term to the base model on the D_pef trajectories, 1 D_pef row per 8 exploration
rows, at eta = 10 (50 times the paper's 0.2; the NULL family's headline strength), with DAPO's
clip-higher and dynamic sampling as in the SQL DPH examples. This is the DPH-JS (eta = 10) arm of
`research/reproduce_dph.py --budget countdown` (which pre-samples into its own folder per seed),
with the same settings (tests/test_countdown_examples.py); same warm start, puzzles and batch as
tuned_examples/grpo/countdown_tiny_grpo.py.

With this warm start D_pef is small: pre-sampling (about 13 minutes on 2 cores) finds 2 of the
2,000 train puzzles solved 8 times of 8 (16 trajectories), so each update's 16 D_pef rows are
about all of D_pef. A weaker base with an empty D_pef stops the run before its first iteration,
with the error that says so.

Every 20 iterations it validates on the first 100 of the 300 test puzzles (8 samples and a greedy
one each: ``evaluation/pass@1``, ``evaluation/pass@8``, ... in the results).

Results to expect (seed 0, 2 CPU cores; docs/results/countdown.md, "The tuned examples on the
third recipe: results"):
    100 iterations in 1,136 s of training time, 16 D_pef rows in every update. Validation pass@8
    35 % (base) -> 33-40 %. On the 300 test puzzles (n = 64) pass@1 10.1 % [8.5, 11.9] (base
    6.7; after - before +3.4 [+2.2, +4.7]), pass@64 64.0 % [58.7, 69.7] (base 77.0; -13.0
    [-18.3, -8.3]): pass@k rises at k <= 4 and falls at k >= 16. The shapes narrow (170 -> 113
    distinct, 5.73 -> 4.48 bits). One seed, and a D_pef of 2 puzzles: no reading of DPH-JS
    against GRPO (docs/collapse.md, "Countdown").
"""

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.envs.countdown import TINY_COUNTDOWN
from rllib_dph.files import home

#: The held-out puzzles: the env's 300 test puzzles, none a training question (``data`` None:
#: the whole split, not a training subset such as DPH's D_exp file).
VALIDATION = TINY_COUNTDOWN.env_config(split="test", size=300, train_size=TINY_COUNTDOWN.size, data=None)

config = (
    DPHConfig()
    .environment("rllib_dph/ReasoningGym-v0", env_config=TINY_COUNTDOWN.env_config())
    .llm(model_name="tiny-countdown-long", temperature=1.0, max_response_length=48)
    .training(
        group_size=8,
        prompts_per_step=16,
        lr=3e-4,
        loss_agg_mode="token-mean",
        trust_region={"kind": "ppo", "high": 0.28},
        dynamic_sampling=True,
    )
    .held_out(val_interval=20, val_env_config=VALIDATION, val_n=8, val_limit=100)
    .dph(
        divergence="js",
        pef_coeff=10.0,
        pef_loss_normalization="original",
        pef_ratio=8,
        presample={"out_dir": str(home() / "presample" / "countdown_tiny_long_k8_all"), "min_correct": 8, "pef_samples": "all"},
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 100, "time_total_s": 1800}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
