"""GRPO on reasoning-gym's countdown (reach a target with + - * / over given numbers) with Qwen2.5-0.5B-Instruct.

How to run (one GPU, bf16 mixed precision; the model in the local Hugging Face cache):
    pip install -e ".[reasoning-gym]"
    huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct
    rllib train file tuned_examples/grpo/countdown_qwen05b_grpo.py

    # Another reasoning-gym data set or difficulty, no code change:
    rllib train file tuned_examples/grpo/countdown_qwen05b_grpo.py --config \
        '{"env_config": {"dataset": "chain_sum", "config": {}, "size": 2000, "seed": 0}}'

    # Solution shapes of a checkpoint on the test split (pass@k per operator pattern,
    # parentheses and number order; distinct correct expressions):
    rllib evaluate <checkpoint> --env rllib_dph/ReasoningGym-v0 --env-config '{"dataset": "countdown",
        "config": {"min_numbers": 3, "max_numbers": 4, "min_target": 10, "max_target": 100},
        "size": 100, "seed": 0, "split": "test", "train_size": 2000}' --n 16 --max-new-tokens 512

`rllib_dph/ReasoningGym-v0` serves any reasoning-gym data set: `dataset`, its `config` fields,
`size` items, `seed`. The training split is 2000 countdown puzzles of 3-4 numbers with targets
10-100; every 10 iterations pass@k is measured on 100 puzzles of the test split (seeds far from
the train seeds, every train question left out: `split="test"`, `train_size` the train size).
The prompt is reasoning-gym's system prompt (answer in `<answer>...</answer>`) and the puzzle
with its format instructions; the reward is countdown's own scorer on the answer (1.0 solved,
0.05 an expression over other numbers, 0 no `<answer>` block or not arithmetic); correct means
full credit. Countdown completions are named by their shape (`countdown_style`), so
`evaluation/style_entropy_bits` and the per-style pass@k follow the solution shapes over training.

Results to expect:
    Not measured as a learning run: no GPU and no Qwen weights were available when this example
    was written; it is validated (tests/test_tuned_examples.py) but has never trained. Why not
    the offline SmolLM2-135M-Instruct (`"model_name": "smollm2-135m-instruct"`): on 16 test
    puzzles (n=8, 256 new tokens, CPU) none of its 128 samples nor its 16 greedy answers wrote an
    `<answer>` block, so every reward was 0 and GRPO would get no signal. Generating the puzzles
    takes about 10 ms each on CPU (about 20 s for the train split, the same again for the test
    split, which regenerates the train questions to leave them out).
"""

from rllib_dph.algorithms.grpo import GRPOConfig

COUNTDOWN = {"min_numbers": 3, "max_numbers": 4, "min_target": 10, "max_target": 100}

config = (
    GRPOConfig()
    .environment(
        "rllib_dph/ReasoningGym-v0",
        env_config={"dataset": "countdown", "config": COUNTDOWN, "size": 2000, "seed": 0},
    )
    .llm(model_name="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16", temperature=1.0, max_response_length=512)
    .env_runners(num_env_runners=0, num_gpus_per_env_runner=1)
    .learners(num_learners=0, num_gpus_per_learner=1)
    .training(
        group_size=8,
        prompts_per_step=32,
        minibatch_size=32,  # 8 updates per batch: bounds the memory of the 151936-token logits
        lr=1e-6,
        num_epochs=1,
        trust_region={"kind": "ppo", "low": 0.2, "high": 0.28},
        loss_agg_mode="token-mean",
        kl_coeff=0.0,
    )
    .held_out(val_interval=10, val_env_config={"split": "test", "size": 100, "train_size": 2000}, val_n=8)
    .debugging(seed=0)
)

stop = {"training_iteration": 200, "time_total_s": 3600}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
