"""GRPO with LoRA on a 7B model on one GPU: Qwen2.5-7B-Instruct on the text-to-SQL suite.

Validated (tests/test_tuned_examples.py) but never trained. Full fine-tuning of a 7B model needs
FSDP2 over four 80 GB GPUs (16 bytes per parameter of fp32 weights, gradients and Adam state);
with LoRA only the adapters get gradients and Adam state, and the learner holds the frozen base
(docs/lora.md; ``bench/memory.py`` for the estimate). With ``kl_coeff > 0`` the reference model
is the base with the adapters disabled: no second 7B model.

How to run (one 80 GB GPU; the model in the local Hugging Face cache):
    pip install -e ".[lora]"
    huggingface-cli download Qwen/Qwen2.5-7B-Instruct
    rllib train file tuned_examples/grpo/sql_qwen7b_grpo_lora.py

Results to expect:
    Not measured. Settings follow the usual LoRA recipes (rank 32 on all linear layers, lr 1e-5,
    bf16, activation checkpointing).
"""

from rllib_dph.algorithms.grpo import GRPOConfig

config = (
    GRPOConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
    .llm(
        model_name="Qwen/Qwen2.5-7B-Instruct",
        dtype="bfloat16",
        temperature=1.0,
        max_response_length=512,
        gradient_checkpointing=True,
        lora={"r": 32, "alpha": 64, "target_modules": "all-linear", "dropout": 0.0},
    )
    .env_runners(num_env_runners=0, num_gpus_per_env_runner=1)
    .learners(num_learners=0, num_gpus_per_learner=1)
    .training(
        group_size=8,
        prompts_per_step=16,
        minibatch_size=32,
        max_tokens_per_microbatch=16384,
        lr=1e-5,
        num_epochs=1,
        trust_region={"kind": "ppo", "low": 0.2, "high": 0.28},
        loss_agg_mode="token-mean",
        kl_coeff=0.0,
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 200}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
