"""The DPH-RL paper's comparison (Tables 1-2, Figure 4) reproduced on the tiny suites.

From the same tiny base model, with the same budget and seeds, trains GRPO, DAPO, RKL, DPH-F,
DPH-JS and α=0.5 (their tuned examples) on the SQL suite, then evaluates the base model and every
result on the in-domain SQL test split, the cross-domain SQL split and out-of-domain math:
greedy accuracy, pass@k (n samples), keep / exploration rates against the base model (paper
§6.1) and the entropy of the SQL solution styles. Writes to `--out`:

- `results.md`: Markdown tables in the layout of the paper's Tables 1 and 2 (mean over seeds and
  prompts with 95 % bootstrap intervals, both redrawn), and each method's paired difference to the
  base model and to GRPO;
- `pass_at_k.png`, `pass_at_k_<split>.png`: pass@k curves with 95 % bands, per split (every seed
  of `--seeds` pooled, as in the tables);
- `style_pass_at_k.png`, `style_pass_at_k_<split>.png`: pass@k per solution style (on the ties
  split: per approach) with error bars, seeds pooled;
- `styles.png` (`styles_ties.png`): solution-style distributions on the in-domain (ties) split,
  like the paper's Figure 4, the seeds' samples counted together;
- with `--curve` (the ties and NULL budgets): pass@64 against training iterations for GRPO and
  DPH-JS, drawn by `research/collapse_search.py --curve` into `docs/results/figures/collapse_curve.png`
  (`docs/results/figures/collapse_nulls_curve.png`) from its own runs (seed 0, the first 100 prompts);
- `runs/<method>_seed<s>/...`: checkpoints and per-split evaluation JSON;
- `summary.json`: every number in the tables.

    python research/reproduce_dph.py --quick        # 1 seed, 36 iterations, 100 prompts, n=16: 7 min on 2 cores
    python research/reproduce_dph.py                # 3 seeds, 100 iterations, all prompts, n=32 (docs/results.md for its time)
    python research/reproduce_dph.py --budget smollm2-cpu   # the real 135M model on 2 CPU cores (see BUDGETS)
    python research/reproduce_dph.py --budget ties          # the pre-registered comparison on the ties family
    python research/reproduce_dph.py --budget ties-quick    # its quick mode
    python research/reproduce_dph.py --budget ties --curve  # and pass@64 along training, GRPO and DPH-JS
    python research/reproduce_dph.py --budget nulls         # the pre-registered comparison on the NULL family
    python research/reproduce_dph.py --budget smollm2-ties-cpu   # the real 135M model on the ties family, 2 CPU cores
    python research/reproduce_dph.py --budget smollm2-lora-cpu   # GRPO and DPH-JS with LoRA on the real model, 2 CPU cores
    python research/reproduce_dph.py --budget smollm2-ties-gpu --out /tmp/r   # the same on one GPU: bf16, the GPU examples' batch
    python research/reproduce_dph.py --budget smollm2-600-ties-gpu --out /tmp/r   # the same on the 5x longer warm start
    python research/reproduce_dph.py --budget smollm2-600-ties-cpu --out /tmp/r   # and its 2-core budget
    python research/reproduce_dph.py --budget smollm2-nulls-cpu   # the real model on the NULL family, 2 CPU cores
    python research/reproduce_dph.py --budget smollm2-nulls-gpu --out /tmp/r   # and on one GPU
    python research/reproduce_dph.py --budget smollm2-600-nulls-cpu   # the same on the 5x longer warm start
    python research/reproduce_dph.py --budget countdown-collapse   # reasoning-gym's countdown: does GRPO lose pass@64?
    python research/reproduce_dph.py --budget countdown            # its pre-registered comparison (docs/collapse.md)
    python research/reproduce_dph.py --budget smollm2-countdown-cpu   # the same on SmolLM2's countdown warm start, 2 CPU cores

The `ties` budgets (docs/collapse.md) add `sql_synth/test_ties`, where only the base
model's minority approach is right, and two DPH-JS variants: "DPH-JS" (8 of 8, all trajectories,
the tuned example) and "DPH-JS (refine)" (8 of 8, one refinement trajectory). The primary
endpoint, fixed before any run, is pass@64 on `test_ties`, DPH-JS − GRPO, printed first. The
`nulls` budget does the same on the NULL family (`tiny-sql-math-nulls` trained on
`sql_synth/train@nulls=0.1`, evaluated on `sql_synth/test_nulls`); its primary endpoint is pass@64
there, DPH-JS (η=10) − GRPO (`PRIMARY_ENDPOINTS`).

Budget: `--iterations` training iterations per run with the tuned examples' batch (16 prompts x
8 completions, one optimizer step each), evaluation on `--eval-limit` prompts of each split (full:
all 300; quick: the first 100) with `--n` samples per prompt at temperature 1 (full: 32, quick:
16) plus one greedy sample; pass@k up to k = n. The work goes to `--workers` processes (default
2: one per core, one torch thread each) as jobs: the base model's evaluations and every run's
training (a DPH run's pre-sampling stage first, in its own folder, again only when the model,
data or sampling settings changed; the DPH variants of one seed draw the k samples once, as
`rllib_dph.algorithms.dph.presample` shares them), then each run's evaluations, one job per split, queued as
its training ends, so that the last jobs to finish are single evaluations. The budget was fixed
before any comparison was looked at; docs/results.md says how it was chosen.
"""

import argparse
import functools
import json
import math
import pathlib
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait

import numpy as np

from workers import worker_pool  # research/workers.py

from rllib_dph.envs.countdown import TINY_COUNTDOWN

REPO = pathlib.Path(__file__).resolve().parents[1]
METHODS = {
    "GRPO": "tuned_examples/grpo/sql_tiny_grpo.py",
    "DAPO": "tuned_examples/grpo/sql_tiny_dapo.py",
    "RKL": "tuned_examples/grpo/sql_tiny_rkl.py",
    "DPH-F": "tuned_examples/dph/sql_tiny_dph_f.py",
    "DPH-JS": "tuned_examples/dph/sql_tiny_dph_js.py",
    "alpha=0.5": "tuned_examples/dph/sql_tiny_dph_alpha.py",
    "DPH-JS (refine)": "tuned_examples/dph/sql_tiny_dph_js.py",
    "GRPO (LoRA)": "tuned_examples/grpo/sql_tiny_grpo.py",
    "DPH-JS (LoRA)": "tuned_examples/dph/sql_tiny_dph_js.py",
    "DPH-JS (η=10)": "tuned_examples/dph/sql_tiny_dph_js.py",
    # The secondary arms of the countdown pre-registration (docs/collapse.md), also run on the NULL family:
    "DPH-JS (η=10, refine)": "tuned_examples/dph/sql_tiny_dph_js.py",
    "DPH-F (η=10)": "tuned_examples/dph/sql_tiny_dph_js.py",
    "NLL (η=10)": "tuned_examples/dph/sql_tiny_dph_js.py",
    "RKL (β=0.625)": "tuned_examples/grpo/sql_tiny_rkl.py",
    "GRPO (entropy 0.01)": "tuned_examples/grpo/sql_tiny_grpo.py",
    # The collapse search's positive control (research/collapse_search.py's epochs4).
    "GRPO (4 updates, lr 1e-3)": "tuned_examples/grpo/sql_tiny_grpo.py",
}
#: Overrides that make a method of :data:`METHODS` differ from its tuned example.
#: LoRA as in tuned_examples/grpo/sql_smollm2_grpo_lora.py (r 16 on every linear layer, alpha 32).
LORA = {"r": 16, "alpha": 32, "target_modules": "all-linear", "dropout": 0.0}
METHOD_OVERRIDES = {
    "DPH-JS (refine)": {"presample": {"pef_samples": "refine"}},
    "GRPO (LoRA)": {"lora": LORA},
    "DPH-JS (LoRA)": {"lora": LORA},
    # 50x the tuned eta: where the D_pef term kept the SQL styles D_pef holds (docs/collapse.md).
    "DPH-JS (η=10)": {"pef_coeff": 10.0},
    # Controls at the headline's strength, each on the same D_pef (8 of 8, all trajectories):
    # one trajectory per D_pef prompt; forward KL; plain NLL (supervised fine-tuning) on the
    # D_pef rows; reverse KL (k3) to the base model on every exploration token at the strength
    # of DPH-JS at eta = 10 (per token both are c (u - 1)^2 near u = 1: JS's 2 x (u - 1)^2 / 8
    # weighed by eta / 8 = 10 / 32, k3's (u - 1)^2 / 2 by beta, so beta = 0.625), on RKL's
    # DAPO settings; GRPO with an entropy bonus.
    "DPH-JS (η=10, refine)": {"pef_coeff": 10.0, "presample": {"pef_samples": "refine"}},
    "DPH-F (η=10)": {"pef_coeff": 10.0, "divergence": "forward_kl"},
    "NLL (η=10)": {"pef_coeff": 10.0, "divergence": "nll"},
    "RKL (β=0.625)": {"kl_coeff": 0.625},
    "GRPO (entropy 0.01)": {"entropy_coeff": 0.01},
    "GRPO (4 updates, lr 1e-3)": {"num_epochs": 2, "minibatch_size": 64, "lr": 1e-3},
}
SPLITS = {
    "in-domain": ("rllib_dph/SQL-v0", {"data": "sql_synth/test"}),
    "cross-domain": ("rllib_dph/SQL-v0", {"data": "sql_synth/test_cross"}),
    "math (OOD)": ("rllib_dph/Math-v0", {"data": "math_synth/test"}),
    "ties": ("rllib_dph/SQL-v0", {"data": "sql_synth/test_ties"}),
    "nulls": ("rllib_dph/SQL-v0", {"data": "sql_synth/test_nulls"}),
    # reasoning-gym's countdown, its own prompts and scorer: 300 test puzzles, none of them a
    # question of the 2,000 train puzzles (rllib_dph.envs.reasoning_gym's test split).
    "countdown": ("rllib_dph/ReasoningGym-v0",
                  TINY_COUNTDOWN.env_config(split="test", size=300, train_size=TINY_COUNTDOWN.size)),
}
#: The two-approach families' test splits and the approach that alone answers them.
FAMILIES = {"ties": "extremum", "nulls": "count_col"}
#: The methods of the budgets before the ties family (DPH-JS with its tuned example's settings).
PAPER_METHODS = ["GRPO", "DAPO", "RKL", "DPH-F", "DPH-JS", "alpha=0.5"]
#: The pre-registered comparison on the ties family (docs/collapse.md): its methods and the
#: overrides of every run (`extremum` answers run to 74 tokens, so 96 cuts none).
TIES_METHODS = ["GRPO", "DAPO", "RKL", "DPH-F", "DPH-JS", "DPH-JS (refine)"]
TIES_CONFIG = {"max_response_length": 96}
#: The NULL family's training data: sql_synth/train with 10 % of the family's ordinary questions.
NULLS_MIX = "sql_synth/train@nulls=0.1"
#: Every run of the countdown budgets (docs/collapse.md, "Countdown"): the tuned examples' warm
#: start (tiny-countdown-long, the third recipe) on reasoning-gym's countdown train puzzles
#: (TINY_COUNTDOWN, the warm start's own), the tuned examples' batch and learning rate; answers
#: are about 15 tokens, 48 cuts none and leaves DAPO's 16-token overlong buffer clear of them.
#: (``data`` None: the SQL examples' data key, which a config update would keep, names no file;
#: DPH sets it to its D_exp file.)
COUNTDOWN_RUNS = {"model_name": "tiny-countdown-long", "env": "rllib_dph/ReasoningGym-v0",
                  "env_config": TINY_COUNTDOWN.env_config(data=None), "max_response_length": 48}
#: Its secondary arms, fixed before they ran (docs/collapse.md).
COUNTDOWN_SECONDARY = ["DAPO", "DPH-JS", "DPH-JS (η=10, refine)", "DPH-F (η=10)", "NLL (η=10)", "RKL (β=0.625)",
                       "GRPO (entropy 0.01)"]
#: The SmolLM2 budgets' batch on 2 CPU cores: fp32, 4 prompts x 8 samples, mini-batches of 16,
#: lr 1e-5 (why, at "smollm2-cpu" below). Every smollm2-*-cpu budget trains with it.
SMOLLM2_CPU_BATCH = {"dtype": "float32", "prompts_per_step": 4, "group_size": 8, "minibatch_size": 16, "lr": 1e-5}
BUDGETS = {
    "full": dict(seeds=[0, 1, 2], iterations=100, eval_limit=None, n=32),
    "quick": dict(seeds=[0], iterations=36, eval_limit=100, n=16),
    # The real model (SmolLM2-135M-Instruct after the warm-start SFT) on 2 CPU cores, what a
    # few hours on a machine without a GPU afford: one GRPO iteration at 4 prompts x 8
    # x 64 tokens costs ~40 s in fp32 on one thread, so 30 iterations per method; the first 128
    # training prompts (what 30 iterations draw, with dynamic sampling's extra draws, and what
    # pre-sampling 9 samples each costs in minutes); lr 1e-5 (the GPU examples' 1e-6 moves a
    # 135M model too little in 30 small steps; the warm start's SFT used 1e-4); evaluation on the
    # first 50 prompts of each split with n = 8. Fixed before any run of it was looked at.
    "smollm2-cpu": dict(
        seeds=[0], iterations=30, eval_limit=50, n=8, methods=["GRPO", "RKL", "DPH-F", "DPH-JS"],
        config={"model_name": "smollm2-135m-sft", **SMOLLM2_CPU_BATCH, "max_response_length": 64,
                "env_config": {"data": "sql_synth/train[:128]"}},
    ),
    # The pre-registered ties comparison: 100 iterations is where the collapse search found GRPO's
    # pass@64 on test_ties 46 points below the base model's (docs/collapse.md).
    "ties": dict(seeds=[0, 1, 2], iterations=100, eval_limit=None, n=64, methods=TIES_METHODS,
                 config=TIES_CONFIG, max_new_tokens=96),
    # The real model on the ties family, fixed before any run of it: the
    # smollm2-cpu budget's model, batch and learning rate with the ties limit of 96 tokens; GRPO
    # against DPH-JS (8 of 8, all trajectories); the first 50 prompts of test and test_ties, n = 16.
    "smollm2-ties-cpu": dict(
        seeds=[0], iterations=30, eval_limit=50, n=16, methods=["GRPO", "DPH-JS"], max_new_tokens=96,
        splits=["in-domain", "ties"],
        config={"model_name": "smollm2-135m-sft", **SMOLLM2_CPU_BATCH, "max_response_length": 96,
                "env_config": {"data": "sql_synth/train[:128]"}},
    ),
    # LoRA on the real model, fixed before any run of it: the smollm2-cpu
    # budget (30 iterations x 4 prompts x 8, 64 tokens, fp32, sql_synth/train[:128], the first 50
    # prompts of each split, n = 8) with rank-16 adapters on every linear layer and 10x its
    # learning rate (1e-4: adapters start at zero; the LoRA tuned example's rule), GRPO and DPH-JS;
    # in-domain and cross-domain splits. Full fine-tuning's numbers at this budget are in
    # docs/results.md ("The same comparison with SmolLM2-135M on 2 CPU cores").
    "smollm2-lora-cpu": dict(
        seeds=[0], iterations=30, eval_limit=50, n=8, methods=["GRPO (LoRA)", "DPH-JS (LoRA)"],
        splits=["in-domain", "cross-domain"],
        config={"model_name": "smollm2-135m-sft", **SMOLLM2_CPU_BATCH, "max_response_length": 64, "lr": 1e-4,
                "env_config": {"data": "sql_synth/train[:128]"}},
    ),
    # The real model on the ties family on one GPU, fixed on 2026-11-26 before
    # any run of it: the GPU tuned examples' batch (bf16, 32 prompts x 8, mini-batches of 64, the
    # learner and the HF engine on the GPU) with the ties limit of 96 tokens; 15 iterations and lr
    # 1e-5 (what 15 minutes on a GPU host afford next to the transfers, the build and pre-sampling:
    # ~11-14 s per iteration on an H100, docs/gpu.md; the examples' 1e-6 did not move the policy in
    # 3 iterations); the first 256 training prompts (15 x 32 draws); GRPO against DPH-JS (8 of 8,
    # all trajectories), 1 seed; the first 100 prompts of test and test_ties, n = 64, bf16 on the
    # GPU. Endpoint as the CPU budget's: ties pass@64, DPH-JS - GRPO, paired over prompts.
    "smollm2-ties-gpu": dict(
        seeds=[0], iterations=15, eval_limit=100, n=64, methods=["GRPO", "DPH-JS"], max_new_tokens=96,
        splits=["in-domain", "ties"], eval_device="cuda", eval_dtype="bfloat16", workers=1,
        config={"model_name": "smollm2-135m-sft", "dtype": "bfloat16", "num_gpus_per_learner": 1,
                "num_gpus_per_env_runner": 1, "prompts_per_step": 32, "group_size": 8, "minibatch_size": 64,
                "max_response_length": 96, "lr": 1e-5, "env_config": {"data": "sql_synth/train[:256]"}},
    ),
    "ties-quick": dict(seeds=[0], iterations=100, eval_limit=50, n=64, methods=["GRPO", "DPH-JS", "DPH-JS (refine)"],
                       config=TIES_CONFIG, max_new_tokens=96, splits=["in-domain", "ties"]),
    # The pre-registered comparison on the NULL family (docs/collapse.md, "The pre-registered readings"; fixed
    # on 2026-11-27 before any run): the ties budget (100 iterations of the tuned examples' batch,
    # 96 tokens, 3 seeds, all prompts, n = 64) on tiny-sql-math-nulls, trained on sql_synth/train
    # with 10 % of the family's ordinary questions mixed in; GRPO, DAPO, DPH-JS (8 of 8, all
    # trajectories) at the tuned eta and at eta = 10. Primary endpoint: nulls pass@64,
    # DPH-JS (eta = 10) - GRPO.
    "nulls": dict(seeds=[0, 1, 2], iterations=100, eval_limit=None, n=64, max_new_tokens=96,
                  methods=["GRPO", "DAPO", "DPH-JS", "DPH-JS (η=10)"], splits=["in-domain", "nulls"],
                  config={**TIES_CONFIG, "model_name": "tiny-sql-math-nulls",
                          "env_config": {"data": NULLS_MIX}}),
}
# The real model on the NULL family (docs/collapse.md, "The NULL family on the
# real model"; fixed on 2026-11-27 before any run of it): each smollm2-ties-<device> budget on
# smollm2-135m-sft-nulls (the 120-step warm start with the family in its SFT pool), trained on the
# same number of the first prompts of sql_synth/train@nulls=0.1, GRPO against the NULL family's
# DPH-JS (8 of 8, all trajectories, eta = 10). Read first GRPO - base on test_nulls (is there a
# collapse to prevent?), then the endpoint: nulls pass@<n>, DPH-JS (eta = 10) - GRPO.
for _name in ("smollm2-ties-gpu", "smollm2-ties-cpu"):
    _config = BUDGETS[_name]["config"]
    BUDGETS[_name.replace("ties", "nulls")] = dict(
        BUDGETS[_name], methods=["GRPO", "DPH-JS (η=10)"], splits=["in-domain", "nulls"],
        config={**_config, "model_name": "smollm2-135m-sft-nulls", "env_config": {
            "data": _config["env_config"]["data"].replace("sql_synth/train", NULLS_MIX)}})

# The smollm2-ties-gpu budget, unchanged, on the 5x longer warm start, which writes the ties
# family's robust approach as a minority (3 % of its test_ties samples; the 120-step one 0.2 %,
# whose right ties answers are lucky thresholds: docs/collapse.md). Fixed on 2026-11-26 before
# any run of it; read first GRPO - base (is there a collapse to prevent?), then the endpoint:
# ties pass@64, DPH-JS - GRPO, paired over prompts.
# The same for smollm2-ties-cpu (fixed on 2026-11-26 before any run, read the same way with k = 16),
# and for the smollm2-nulls-<device> budgets on smollm2-135m-sft-600-nulls (fixed on 2026-11-27
# before any run of them: on the 120-step warm start D_pef held 3 prompts of 128, docs/collapse.md).
for _name in ("smollm2-ties-gpu", "smollm2-ties-cpu", "smollm2-nulls-gpu", "smollm2-nulls-cpu"):
    _model = BUDGETS[_name]["config"]["model_name"].replace("smollm2-135m-sft", "smollm2-135m-sft-600")
    BUDGETS[_name.replace("smollm2-", "smollm2-600-")] = dict(
        BUDGETS[_name], config={**BUDGETS[_name]["config"], "model_name": _model})

# The NULL family's headline in about 15 minutes on 2 cores: the nulls budget's primary endpoint
# (GRPO against DPH-JS at eta = 10, 100 iterations, all 300 test_nulls prompts, n = 64) on seed 0
# alone, test_nulls only. One seed of three: a check that the effect is there, not the endpoint.
BUDGETS["nulls-quick"] = dict(BUDGETS["nulls"], seeds=[0], methods=["GRPO", "DPH-JS (η=10)"], splits=["nulls"])
# Countdown (reasoning-gym), a task not built for the test (docs/collapse.md, "Countdown"; fixed
# on 2026-11-28 before any trained policy was evaluated, and run only on a base model that passes
# the gate written there). The collapse search: GRPO as tuned and its positive control (4
# updates per batch at lr 1e-3), seed 0, against the base model on all 300 test puzzles, n = 64
# (about 15 minutes on 2 cores). The comparison: GRPO against DPH-JS (8 of 8, all trajectories,
# eta = 10), 3 seeds, 100 iterations of the tuned examples' batch, all 300 test puzzles, n = 64
# (about 40 minutes); primary endpoint countdown pass@64, DPH-JS (eta = 10) - GRPO; its
# secondary arms (COUNTDOWN_SECONDARY) run with --methods on the same folder. The quick mode:
# seed 0, 60 iterations, the first 100 puzzles (about 9 minutes; pre-sampling's 2,000 x 8 samples
# are a third of its critical path), exploratory.
_COUNTDOWN = dict(iterations=100, eval_limit=None, n=64, max_new_tokens=48, splits=["countdown"], config=COUNTDOWN_RUNS)
BUDGETS["countdown-collapse"] = dict(_COUNTDOWN, seeds=[0], methods=["GRPO", "GRPO (4 updates, lr 1e-3)"])
BUDGETS["countdown"] = dict(_COUNTDOWN, seeds=[0, 1, 2], methods=["GRPO", "DPH-JS (η=10)"])
BUDGETS["countdown-quick"] = dict(_COUNTDOWN, seeds=[0], iterations=60, eval_limit=100, methods=["GRPO", "DPH-JS (η=10)"])
# Countdown on the real model (docs/collapse.md, "Countdown on SmolLM2"; fixed on 2026-11-29
# before the warm start was built): smollm2-135m-countdown, trained on the first 128 of the 2,000
# training puzzles with the smollm2-*-cpu budgets' batch, precision and learning rate, evaluated on
# the first 100 test puzzles with n = 16 (48 tokens: the worked answers run to 34). First the
# collapse search (GRPO seed 0 against the base model), then the comparison, each only past its gate.
_SMOLLM2_COUNTDOWN = dict(
    iterations=30, eval_limit=100, n=16, max_new_tokens=48, splits=["countdown"],
    config={**COUNTDOWN_RUNS, "model_name": "smollm2-135m-countdown", **SMOLLM2_CPU_BATCH,
            "env_config": TINY_COUNTDOWN.env_config(data=None, size=128)},
)
BUDGETS["smollm2-countdown-cpu-collapse"] = dict(_SMOLLM2_COUNTDOWN, seeds=[0], methods=["GRPO"])
BUDGETS["smollm2-countdown-cpu"] = dict(_SMOLLM2_COUNTDOWN, seeds=[0, 1, 2], methods=["GRPO", "DPH-JS (η=10)"])


def eval_path(out: pathlib.Path, split: str) -> pathlib.Path:
    return out / f"eval_{split.split()[0]}.json"


def evaluate(method: str | None, seed: int, out: str, split: str, args) -> str:
    """Evaluates one run (``method`` None: the base model) on ``split`` into its JSON file under
    ``out``; returns what it did. A run's policy is its checkpoint (:func:`train` made it)."""
    from rllib_dph.engines.base import SamplingParams
    from rllib_dph.evaluation import EvalSettings, evaluate_policy
    from rllib_dph.models.build.prepare import prepare_model

    out = pathlib.Path(out)
    if method is None:
        policy, name = prepare_model(args.overrides.get("model_name", "tiny-sql-math")).location, "Base model"
    else:
        policy, name = out / "checkpoint", method
    settings = EvalSettings(sampling=SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens,
                                                    seed=0), limit=args.eval_limit)
    env_id, env_config = SPLITS[split]
    evaluate_policy(str(policy), env_id, env_config, settings, name=name, device=args.eval_device,
                    dtype=args.eval_dtype).to_json(eval_path(out, split))
    return f"{job_name(method, seed)} evaluated on {split}"


def job_name(method: str | None, seed: int) -> str:
    return "base model" if method is None else f"{method} seed {seed}"


def missing_splits(out: pathlib.Path, splits) -> list[str]:
    """The splits of ``splits`` that ``out`` holds no evaluation of. Each one there is checked
    against the split's data now (:func:`load_evaluation`); a run evaluated on every split is
    reused as it is, neither trained nor pre-sampled for (its checkpoint need not be there)."""
    return [split for split in splits if not (eval_path(out, split).exists() and load_evaluation(out, split))]


def load_evaluation(out: pathlib.Path, split: str):
    """The evaluation of ``split`` stored under ``out``, checked against the split's tasks now
    (``rllib_dph.evaluation.results.check_current``): a file of data that has changed since (the
    ties family's version 1, say) is refused with the fix, one written before task fingerprints
    were recorded is read with a warning."""
    path = eval_path(out, split)
    stat = path.stat()
    return _read_checked(str(path), split, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _read_checked(path: str, split: str, mtime_ns: int, size: int):
    """One read and check of a stored evaluation per version of its file (a run's reuse check,
    the pre-sampling plan and the tables all ask for it); warns once about a legacy file."""
    from rllib_dph.evaluation import EvalResult
    from rllib_dph.evaluation.results import check_current

    result = EvalResult.from_json(path)
    unchecked = check_current(result, split_tasks(split), path)
    if unchecked:
        print(f"warning: {path} was written before task fingerprints were recorded; {unchecked} of its "
              f"{len(result.records)} prompts cannot be checked against the data now.")
    return result


@functools.lru_cache(maxsize=None)
def split_tasks(split: str) -> tuple:
    """The tasks of an evaluation split now: a suite split's, or those its env makes (reasoning-gym)."""
    from rllib_dph.envs import make_env
    from rllib_dph.envs.suites import load_split

    env_id, env_config = SPLITS[split]
    if "data" in env_config:
        return tuple(load_split(env_config["data"]))
    return tuple(make_env(env_id, env_config).unwrapped.tasks)


def load_results(out: pathlib.Path, splits) -> dict:
    """The per-split evaluation results that :func:`evaluate` wrote under ``out`` (checked)."""
    return {split: load_evaluation(out, split) for split in splits}


def run_config(method: str, args, seed: int | None = None):
    """``method``'s tuned example with the budget's and ``--config``'s overrides, and ``seed``.

    A DPH run for another model than its tuned example's pre-samples into its own folder (the
    example's ``presample.out_dir`` + ``_<model>``), and so does a variant with other pre-sampling
    rules (+ ``_<pef_samples>``) and each seed (+ ``_seed<seed>``: the seed is part of what a
    pre-sampling folder holds), so that runs never take turns setting each other's files aside
    as stale (found on 2026-11-26: the 3 seeds of a method shared one folder, each re-sampled
    it, and a run whose files another seed had replaced between its check and its learner's
    read could train on that seed's D_pef).
    """
    from rllib_dph.algorithms.dph import DPHConfig
    from rllib_dph.cli.experiments import load_tuned_example

    config, _ = load_tuned_example(str(REPO / METHODS[method]))
    seeded = {} if seed is None else {"seed": seed}
    if not isinstance(config, DPHConfig):
        return config.update_from_dict({**METHOD_OVERRIDES.get(method, {}), **args.overrides, **seeded})
    tuned_model, tuned_pef = config.model_name, config.presample.pef_samples
    config.update_from_dict(METHOD_OVERRIDES.get(method, {})).update_from_dict({**args.overrides, **seeded})
    out_dir = config.presample.out_dir
    if out_dir:
        if config.model_name != tuned_model:
            out_dir = f"{out_dir}_{pathlib.Path(config.model_name).name}"
        if config.presample.pef_samples != tuned_pef:
            out_dir = f"{out_dir}_{config.presample.pef_samples}"
        if seed is not None:
            out_dir = f"{out_dir}_seed{seed}"
        config.dph(presample={"out_dir": out_dir})
    return config


def train(method: str, seed: int, out: str, args) -> str:
    """Trains one method/seed for the budget into ``out/checkpoint`` (kept when there; a DPH
    run pre-samples first, in ``DPH.setup``); returns what it did."""
    out = pathlib.Path(out)
    ckpt = out / "checkpoint"
    if (ckpt / "learner_group").exists():
        return f"{job_name(method, seed)}: checkpoint kept"
    algo = run_config(method, args, seed).build_algo()
    curve = []
    for _ in range(args.iterations):
        curve.append(float(algo.train()["env_runners"]["reward_mean"]))
    algo.save_to_path(str(ckpt))
    algo.stop()
    (out / "train_reward.json").write_text(json.dumps(curve))
    return f"{job_name(method, seed)} trained"


def cell(values: np.ndarray) -> tuple[str, dict]:
    """``"62.0 [48.0, 74.0]"``: the mean in % over seeds and prompts with its 95 % interval (both redrawn)."""
    from rllib_dph.evaluation.intervals import format_interval, mean_interval

    mean, interval = float(values.mean()), mean_interval(values)
    return format_interval(mean, interval, scale=100), {"mean": mean, "ci95": list(interval)}


#: The column prefix of each split's metrics (the in-domain split's have none).
PREFIX = {"in-domain": "", "cross-domain": "cross ", "math (OOD)": "math ", "ties": "ties ", "nulls": "nulls ",
          "countdown": "countdown "}
#: The splits whose style entropy is reported: in-domain (SQL styles), the families (where one
#: style is right) and countdown (solution shapes).
ENTROPY_SPLITS = ("in-domain", *FAMILIES, "countdown")
#: The splits with a pass@k row per style in the claims table (countdown has dozens of shapes:
#: its shapes table sums them up by operator pattern, parentheses and number order instead).
STYLE_CLAIM_SPLITS = ("in-domain", *FAMILIES)


def _entropy_cell(results: list) -> tuple[str, dict]:
    """The style entropy (bits) of per-seed results of one split, with its 95 % interval."""
    from rllib_dph.evaluation import style_entropy
    from rllib_dph.evaluation.intervals import entropy_interval, format_interval

    entropy = float(np.mean([r.summary().get("style_entropy_bits", 0.0) for r in results]))
    styles = sorted({s for r in results for s in r.style_counts()})
    ci = entropy_interval(np.array([r.style_matrix(styles) for r in results]), style_entropy, styles) if styles else None
    return format_interval(entropy, ci, digits=2), {"mean": entropy, "ci95": list(ci or [])}


def _row_cells(per_seed: list[dict], base: dict, k_mid: int, k_max: int, is_base: bool) -> dict:
    """The cells of one method's row, for the splits it was evaluated on: metric name -> (text, numbers)."""
    from rllib_dph.evaluation import compare, seed_matrix
    from rllib_dph.evaluation.intervals import format_interval, keep_exploration_intervals, mean_interval

    def split(name: str) -> list:
        return [r[name] for r in per_seed]

    ran = per_seed[0]  # the splits this method was evaluated on
    cells = {}
    if "in-domain" in ran:
        cells["greedy"] = cell(seed_matrix(split("in-domain"), "greedy_accuracy"))
        cells.update({f"pass@{k}": cell(seed_matrix(split("in-domain"), f"pass@{k}")) for k in (1, k_mid, k_max)})
    for name in ("cross-domain", "math (OOD)"):
        if name in ran:
            cells[f"{PREFIX[name]}greedy"] = cell(seed_matrix(split(name), "greedy_accuracy"))
            cells[f"{PREFIX[name]}pass@{k_max}"] = cell(seed_matrix(split(name), f"pass@{k_max}"))
    for family, robust in FAMILIES.items():
        if family in ran:
            cells[f"{family} pass@{k_max}"] = cell(seed_matrix(split(family), f"pass@{k_max}"))
            cells[f"{family} {robust} pass@{k_max}"] = cell(seed_matrix(split(family), f"pass@{k_max}/{robust}"))
    if "countdown" in ran:
        cells["countdown greedy"] = cell(seed_matrix(split("countdown"), "greedy_accuracy"))
        cells.update({f"countdown pass@{k}": cell(seed_matrix(split("countdown"), f"pass@{k}"))
                      for k in sorted({1, min(8, k_max), k_mid, k_max})})
        distinct = seed_matrix(split("countdown"), f"distinct_correct@{k_max}")
        cells[f"countdown distinct@{k_max}"] = (format_interval(float(distinct.mean()), mean_interval(distinct), digits=2),
                                                {"mean": float(distinct.mean()), "ci95": list(mean_interval(distinct))})
    if not is_base and "in-domain" in ran:
        rates = [compare(r, base["in-domain"], k_max) for r in split("in-domain")]
        keep_ci, explore_ci = keep_exploration_intervals(
            base["in-domain"].per_prompt(f"pass@{k_max}"), seed_matrix(split("in-domain"), f"pass@{k_max}")
        )
        for name, key, ci in (("keep", "keep_rate", keep_ci), ("explore", "exploration_rate", explore_ci)):
            values = np.array([x[key] for x in rates], dtype=float)  # NaN where no prompt qualifies
            mean = float(values[np.isfinite(values)].mean()) if np.isfinite(values).any() else float("nan")
            cells[name] = (format_interval(mean, ci, scale=100), {"mean": mean, "ci95": list(ci)})
    for name in ENTROPY_SPLITS:
        if name in ran:
            cells[f"{PREFIX[name]}style entropy"] = _entropy_cell(split(name))
    return cells


def tables(base: dict, runs: dict, args) -> tuple[str, dict]:
    """Markdown tables (paper Tables 1-2 layout, 95 % intervals) and the numbers behind them."""
    k_mid, k_max = max(1, args.n // 2), args.n
    rows = {name: _row_cells(per_seed, base, k_mid, k_max, name == "Base model")
            for name, per_seed in [("Base model", [base])] + list(runs.items())}
    columns = list(dict.fromkeys(c for cells in rows.values() for c in cells))  # every row's, in order
    last = [c for c in ("keep", "explore") if c in columns] + [c for c in columns if c.endswith("style entropy")]
    columns = [c for c in columns if c not in last] + last
    lines = [f"| method | {' | '.join(c.replace('keep', f'keep@{k_max}').replace('explore', f'explore@{k_max}') for c in columns)} |",
             "|" + " --- |" * (1 + len(columns))]
    numbers: dict = {"methods": {}}
    for name, cells in rows.items():
        numbers["methods"][name] = {metric: value for metric, (_, value) in cells.items()}
        lines.append(f"| {name} | " + " | ".join(cells[c][0] if c in cells else "—" for c in columns) + " |")
    lines += ["", differences(base, runs, k_max, numbers)]
    seeds = seed_statistics(base, runs, k_max, numbers)
    if seeds:
        lines += ["", seeds]
    if "countdown" in base:
        shapes, numbers["countdown shapes"] = shapes_table(base, runs)
        lines += ["", "Solution shapes on countdown (% of the samples with an answer expression; a method's seeds "
                  "counted together; 95 % intervals over prompts and seeds):", "", shapes]
    entropy_differences(base, runs, numbers)
    style_differences(base, runs, k_max, numbers)
    if any(m in numbers["differences"] for m in DPH_VARIANTS):
        lines += ["", f"The paper's claims, read from the paired differences (margins: {MARGINS['rate']:g} points, "
                  f"{MARGINS['bits']:g} bits):", "", claims(numbers, k_max)]
    return "\n".join(lines), numbers


def references(base: dict, runs: dict) -> list[tuple[str, str, list]]:
    """What each method is compared with, as ``(label, run name, per-seed results)``: the base
    model, GRPO and DAPO (whose clip-higher and dynamic-sampling settings the DPH tuned examples
    share), those that ran; in a budget of LoRA runs, their LoRA runs under the same labels; and
    DPH-JS at η = 10 when a control ran beside it (:data:`CONTROLS`: what the control does
    against the term it stands in for)."""
    refs = [("base", "base", [base])]
    for family in ("GRPO", "DAPO"):
        name = next((n for n in (family, f"{family} (LoRA)") if n in runs), None)
        if name is not None:
            refs.append((family, name, runs[name]))
    if "DPH-JS (η=10)" in runs and any(m in runs for m in CONTROLS):
        refs.append(("DPH-JS (η=10)", "DPH-JS (η=10)", runs["DPH-JS (η=10)"]))
    return refs


#: The control arms beside DPH-JS (η=10) (METHOD_OVERRIDES says what each is).
CONTROLS = ("DPH-JS (η=10, refine)", "DPH-F (η=10)", "NLL (η=10)", "RKL (β=0.625)", "GRPO (entropy 0.01)")


def paired(per_seed: list[dict], ref_seeds: list[dict], split: str, metric: str) -> dict:
    """``{"mean", "ci95"}``: a method's mean of ``metric`` on ``split`` minus a reference's, over
    seeds and prompts, with the paired 95 % interval (the same prompts redrawn for both sides)."""
    from rllib_dph.evaluation import seed_matrix
    from rllib_dph.evaluation.intervals import paired_difference_interval

    a, b = seed_matrix([r[split] for r in per_seed], metric), seed_matrix([r[split] for r in ref_seeds], metric)
    return {"mean": float(a.mean() - b.mean()), "ci95": list(paired_difference_interval(a, b))}


def differences(base: dict, runs: dict, k_max: int, numbers: dict) -> str:
    """A Markdown table of each method's paired difference (:func:`paired`) to the base model, GRPO and DAPO."""
    from rllib_dph.evaluation.intervals import format_interval

    metrics = [("in-domain", "greedy_accuracy", "greedy"), ("in-domain", "pass@1", "pass@1"),
               ("in-domain", f"pass@{k_max}", f"pass@{k_max}"),
               ("cross-domain", f"pass@{k_max}", f"cross pass@{k_max}"), ("math (OOD)", f"pass@{k_max}", f"math pass@{k_max}"),
               *((family, f"pass@{k_max}", f"{family} pass@{k_max}") for family in FAMILIES),
               ("countdown", "greedy_accuracy", "countdown greedy"), ("countdown", "pass@1", "countdown pass@1"),
               ("countdown", f"pass@{k_max}", f"countdown pass@{k_max}")]
    metrics = [m for m in metrics if m[0] in base]
    refs = references(base, runs)
    head = " | ".join(f"{label} − {ref}" for ref, _, _ in refs for _, _, label in metrics)
    lines = ["Paired differences in points, with 95 % intervals (the same prompts redrawn for both sides):",
             "", f"| method | {head} |", "|" + " --- |" * (1 + len(refs) * len(metrics))]
    numbers["differences"] = {}
    for method, per_seed in runs.items():
        texts = []
        for ref, ref_name, ref_seeds in refs:
            for split, metric, label in metrics:
                if ref_name == method:
                    texts.append("—")
                    continue
                diff = paired(per_seed, ref_seeds, split, metric)
                texts.append(format_interval(diff["mean"], tuple(diff["ci95"]), scale=100))
                numbers["differences"].setdefault(method, {})[f"{label} − {ref}"] = diff
        lines.append(f"| {method} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def entropy_differences(base: dict, runs: dict, numbers: dict) -> None:
    """Adds each method's paired style-entropy difference to the base model, GRPO and DAPO, on
    each split of :data:`ENTROPY_SPLITS` it was evaluated on, to ``numbers``."""
    from rllib_dph.evaluation import style_entropy
    from rllib_dph.evaluation.intervals import paired_entropy_difference_interval

    for method, per_seed in runs.items():
        for ref, ref_name, ref_seeds in references(base, runs):
            for split in (s for s in ENTROPY_SPLITS if s in per_seed[0] and ref_name != method):
                results = [r[split] for r in per_seed] + [r[split] for r in ref_seeds]
                styles = sorted({s for r in results for s in r.style_counts() if s != "none"})
                if not styles:
                    continue
                a = np.array([r[split].style_matrix(styles) for r in per_seed])  # (S, P, K)
                b = np.array([r[split].style_matrix(styles) for r in ref_seeds])
                diff = style_entropy(dict(zip(styles, a.sum(axis=(0, 1))))) - style_entropy(dict(zip(styles, b.sum(axis=(0, 1)))))
                ci = paired_entropy_difference_interval(a, b, style_entropy, styles)
                key = f"{PREFIX[split]}style entropy − {ref}"
                numbers["differences"].setdefault(method, {})[key] = {"mean": diff, "ci95": list(ci)}


def style_differences(base: dict, runs: dict, k_max: int, numbers: dict) -> None:
    """Adds each method's paired difference of pass@``k_max`` per solution style (a style's
    correct samples only: ``EvalResult.per_prompt("pass@k/<style>")``) to the base model, GRPO
    and DAPO, for every style the base model writes correctly on each split of
    :data:`ENTROPY_SPLITS` (a style it never gets right has nothing to keep), to
    ``numbers["differences"]``; the styles of each split go to ``numbers["styles"]``."""
    numbers["styles"] = {split: [s for s in base[split].solution_styles() if np.mean(base[split].per_prompt(f"pass@{k_max}/{s}")) > 0]
                         for split in STYLE_CLAIM_SPLITS if split in base}
    for method, per_seed in runs.items():
        for ref, ref_name, ref_seeds in references(base, runs):
            for split in (s for s in numbers["styles"] if s in per_seed[0] and ref_name != method):
                for style in numbers["styles"][split]:
                    key = f"{PREFIX[split]}{style} pass@{k_max} − {ref}"
                    numbers["differences"].setdefault(method, {})[key] = paired(per_seed, ref_seeds, split,
                                                                                f"pass@{k_max}/{style}")


#: The methods whose claims :func:`claims` reads, the DPH variants and the controls beside them
#: (a budget without any has no claims table).
DPH_VARIANTS = ("DPH-F", "DPH-JS", "DPH-JS (refine)", "DPH-JS (LoRA)", "DPH-JS (η=10)", "DPH-JS (η=10, refine)",
                "DPH-F (η=10)", "NLL (η=10)", "RKL (β=0.625)", "GRPO (entropy 0.01)")
#: Margins of the claims: points for rates, bits for the style entropy.
MARGINS = {"rate": 3.0, "bits": 0.1}


def verdict(diff: dict, margin: float, scale: float, kind: str) -> str:
    """Whether a paired difference ``{"mean", "ci95"}`` (in units of ``1/scale``) bears out a claim.

    ``kind="kept"`` (non-inferiority: no loss larger than ``margin``): holds when the 95 %
    interval's lower end is >= -margin, does not hold when the whole interval is below 0 and
    reaches past -margin. ``kind="above"`` (superiority): holds when the interval is above 0,
    does not hold when it is below 0 or within [-margin, margin] (no gain worth the name).
    Anything else: cannot tell.
    """
    low, high = (round(x * scale, 9) for x in diff["ci95"])  # -0.03 * 100 is -3.0000000000000004
    if kind == "kept":
        if low >= -margin:
            return "holds"
        return "does not hold" if high < 0 else "cannot tell"
    if kind != "above":
        raise ValueError(f"verdict: kind={kind!r} must be 'kept' or 'above'.")
    if low > 0:
        return "holds"
    if high < 0:
        return "does not hold (lower)"
    if low >= -margin and high <= margin:
        return f"does not hold (no difference beyond ±{margin:g})"
    return "cannot tell"


#: The pre-registered primary endpoints (docs/collapse.md): (method, family), each read against GRPO.
PRIMARY_ENDPOINTS = (("DPH-JS", "ties"), ("DPH-JS (η=10)", "nulls"), ("DPH-JS (η=10)", "countdown"))


def primary_reading(diff: dict) -> str:
    """The pre-registered reading of the primary endpoint (docs/collapse.md): DPH-JS keeps pass@k
    better than GRPO when the 95 % interval lies above 0, worse when below, else cannot tell."""
    low, high = diff["ci95"]
    if low > 0:
        return "DPH-JS better than GRPO"
    return "DPH-JS worse than GRPO" if high < 0 else "cannot tell"


def primary_endpoints(numbers: dict, k_max: int) -> list[str]:
    """One line per pre-registered primary endpoint (:data:`PRIMARY_ENDPOINTS`) that ``numbers``
    holds: the split (its data file, or the env's test split for reasoning-gym's), the difference
    to GRPO with its interval, and the reading."""
    lines = []
    for method, family in PRIMARY_ENDPOINTS:
        primary = numbers["differences"].get(method, {}).get(f"{family} pass@{k_max} − GRPO")
        if primary is not None:
            low, high = (100 * x for x in primary["ci95"])
            env_config = SPLITS[family][1]
            where = env_config.get("data") or f"{env_config['dataset']}'s {env_config['size']} test puzzles"
            lines.append(f"**Primary endpoint** (pre-registered, docs/collapse.md): pass@{k_max} on {where}, "
                         f"{method} − GRPO = {100 * primary['mean']:+.1f} [{low:+.1f}, {high:+.1f}] points: "
                         f"{primary_reading(primary)}.")
    return lines


def claims(numbers: dict, k_max: int, methods=DPH_VARIANTS) -> str:
    """One row per claim of the DPH-RL paper, one column per DPH variant: verdict and numbers.

    Each claim is read from a paired difference and its 95 % interval (:func:`verdict`, margins
    :data:`MARGINS`): "kept" claims against the base model (and greedy against GRPO, which the
    paper says DPH matches), "above" claims against GRPO and against DAPO, whose settings the DPH
    tuned examples share (so the DAPO rows isolate the D_pef term); then pass@k per solution style
    (:func:`style_differences`), kept and above GRPO, for each split's styles in
    ``numbers["styles"]``. A row none of ``methods`` has a number for (a split not evaluated, a
    method not run) is left out.
    """
    rate, bits = MARGINS["rate"], MARGINS["bits"]
    rows = [
        (f"pass@{k_max} kept (vs base)", f"pass@{k_max} − base", "kept", rate, 100),
        (f"pass@{k_max} above GRPO", f"pass@{k_max} − GRPO", "above", rate, 100),
        ("greedy kept (vs base)", "greedy − base", "kept", rate, 100),
        ("greedy as good as GRPO", "greedy − GRPO", "kept", rate, 100),
        (f"cross-domain pass@{k_max} kept (vs base)", f"cross pass@{k_max} − base", "kept", rate, 100),
        (f"cross-domain pass@{k_max} above GRPO", f"cross pass@{k_max} − GRPO", "above", rate, 100),
        (f"math (OOD) pass@{k_max} kept (vs base)", f"math pass@{k_max} − base", "kept", rate, 100),
        (f"math (OOD) pass@{k_max} above GRPO", f"math pass@{k_max} − GRPO", "above", rate, 100),
        (f"ties pass@{k_max} kept (vs base)", f"ties pass@{k_max} − base", "kept", rate, 100),
        (f"ties pass@{k_max} above GRPO (the primary endpoint for DPH-JS)", f"ties pass@{k_max} − GRPO", "above", rate, 100),
        (f"nulls pass@{k_max} kept (vs base)", f"nulls pass@{k_max} − base", "kept", rate, 100),
        (f"nulls pass@{k_max} above GRPO (the primary endpoint for DPH-JS (η=10))", f"nulls pass@{k_max} − GRPO", "above", rate, 100),
        (f"countdown pass@{k_max} kept (vs base)", f"countdown pass@{k_max} − base", "kept", rate, 100),
        (f"countdown pass@{k_max} above GRPO (the primary endpoint for DPH-JS (η=10))", f"countdown pass@{k_max} − GRPO",
         "above", rate, 100),
        ("countdown pass@1 as good as GRPO", "countdown pass@1 − GRPO", "kept", rate, 100),
        ("countdown shapes kept (entropy vs base, bits)", "countdown style entropy − base", "kept", bits, 1),
        ("countdown shapes above GRPO (entropy, bits)", "countdown style entropy − GRPO", "above", bits, 1),
        ("styles kept (entropy vs base, bits)", "style entropy − base", "kept", bits, 1),
        ("styles above GRPO (entropy, bits)", "style entropy − GRPO", "above", bits, 1),
        ("ties styles kept (entropy vs base, bits)", "ties style entropy − base", "kept", bits, 1),
        ("ties styles above GRPO (entropy, bits)", "ties style entropy − GRPO", "above", bits, 1),
        ("nulls approaches kept (entropy vs base, bits)", "nulls style entropy − base", "kept", bits, 1),
        ("nulls approaches above GRPO (entropy, bits)", "nulls style entropy − GRPO", "above", bits, 1),
        (f"pass@{k_max} above DAPO", f"pass@{k_max} − DAPO", "above", rate, 100),
        (f"ties pass@{k_max} above DAPO", f"ties pass@{k_max} − DAPO", "above", rate, 100),
        (f"nulls pass@{k_max} above DAPO", f"nulls pass@{k_max} − DAPO", "above", rate, 100),
        ("styles above DAPO (entropy, bits)", "style entropy − DAPO", "above", bits, 1),
    ]
    for split, styles in numbers.get("styles", {}).items():  # pass@k per style (the paper's Figure 4)
        for style in styles:
            key, name = f"{PREFIX[split]}{style} pass@{k_max}", f"{PREFIX[split]}`{style}` pass@{k_max}"
            rows += [(f"{name} kept (vs base)", f"{key} − base", "kept", rate, 100),
                     (f"{name} above GRPO", f"{key} − GRPO", "above", rate, 100)]
    present = [m for m in methods if m in numbers["differences"]]
    lines = [f"| claim | {' | '.join(present)} |", "|" + " --- |" * (1 + len(present))]
    for claim, key, kind, margin, scale in rows:
        if not any(key in numbers["differences"][m] for m in present):
            continue
        texts = []
        for method in present:
            diff = numbers["differences"][method].get(key)
            if diff is None:
                texts.append("—")
                continue
            low, high = (x * scale for x in diff["ci95"])
            digits = 1 if scale == 100 else 2
            texts.append(f"{verdict(diff, margin, scale, kind)}: {diff['mean'] * scale:+.{digits}f} "
                         f"[{low:+.{digits}f}, {high:+.{digits}f}]")
        lines.append(f"| {claim} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def nulls_cluster(task) -> tuple[str, str, str]:
    """The cluster of a `sql_synth/test_nulls` question: its (database, table, column), read from
    its gold query's ``COUNT(column) FROM table``. Questions on one table and column of one
    database share the schema and the values that decide them."""
    import re

    match = re.search(r"COUNT\((?:\w+\.)?(\w+)\)\s+FROM\s+(\w+)", task.ground_truth["gold_sql"])
    if match is None:
        raise ValueError(f"nulls_cluster: {task.id}'s gold query {task.ground_truth['gold_sql']!r} has no COUNT(col) FROM table.")
    return task.ground_truth["db_id"], match.group(2), match.group(1)


def ties_cluster(task) -> tuple[str, str, str]:
    """The cluster of a `sql_synth/test_ties` question: its (database, table, column), the table
    its gold query reads (``a+b`` for a join) and the column whose top ties: the ``GROUP BY``
    column, or the column of ``MAX``/``MIN``."""
    import re

    sql = task.ground_truth["gold_sql"]
    grouped = re.search(r"FROM\s+(\w+)(?:\s+JOIN\s+(\w+))?.*?GROUP BY\s+(?:\w+\.)?(\w+)", sql)
    if grouped is not None:
        table = "+".join(t for t in grouped.group(1, 2) if t)
        return task.ground_truth["db_id"], table, grouped.group(3)
    extremum = re.search(r"(?:MAX|MIN)\((?:\w+\.)?(\w+)\)\s+FROM\s+(\w+)", sql)
    if extremum is None:
        raise ValueError(f"ties_cluster: {task.id}'s gold query {sql!r} has neither GROUP BY col nor MAX/MIN(col) FROM table.")
    return task.ground_truth["db_id"], extremum.group(2), extremum.group(1)


def schema_cluster(task) -> tuple[str, str]:
    """The cluster of a `sql_synth/test` question: its (database, tables), the tables its gold
    query's ``FROM`` reads (``a+b`` for a join). Questions on one table of one database share its
    schema and rows, and every template asked of them."""
    import re

    sql = task.ground_truth["gold_sql"]
    tables = re.search(r"FROM\s+(\w+)(?:\s+JOIN\s+(\w+))?", sql, re.IGNORECASE)
    if tables is None:
        raise ValueError(f"schema_cluster: {task.id}'s gold query {sql!r} has no FROM table.")
    return task.ground_truth["db_id"], "+".join(t for t in tables.group(1, 2) if t)


#: The splits whose prompts fall into clusters, and each prompt's cluster: the seed-level
#: statistics add a bootstrap over clusters there.
CLUSTERS = {"nulls": nulls_cluster, "ties": ties_cluster, "in-domain": schema_cluster}
#: The endpoints the seed-level statistics are given for: (split, metric label prefix).
SEED_ENDPOINT_SPLITS = ("ties", "nulls", "countdown")


def seed_statistics(base: dict, runs: dict, k_max: int, numbers: dict) -> str:
    """A Markdown table, for every method with 2 or more seeds against GRPO (when GRPO has 2 or
    more), of pass@``k_max`` on each family split of :data:`SEED_ENDPOINT_SPLITS` it was evaluated
    on: the per-seed values of both, the paired bootstrap over prompts and seeds (the tables'),
    Welch's t interval and the exact permutation p-value with the seed as the unit, and on a
    split with clusters (:data:`CLUSTERS`) the bootstrap over clusters and seeds; the numbers go
    to ``numbers["seed_statistics"]``. Empty when there is nothing to compare."""
    from rllib_dph.evaluation import seed_matrix
    from rllib_dph.evaluation.intervals import (
        cluster_paired_difference_interval,
        format_interval,
        paired_difference_interval,
        permutation_p_value,
        seed_means,
        welch_interval,
    )

    grpo = runs.get("GRPO")
    if grpo is None or len(grpo) < 2:
        return ""
    lines = ["Seed-level statistics of each pass@k endpoint against GRPO (points; seed values in %): the per-seed "
             "values, the bootstrap over prompts and seeds, Welch's t interval and the exact permutation p-value "
             "with the seed as the unit, and on the NULL and ties families the bootstrap over their question clusters "
             "(database, table, column) and seeds:", "",
             "| endpoint | method | method's seeds | GRPO's seeds | bootstrap (prompts, seeds) | Welch t (seeds) | "
             "permutation p (seeds) | cluster bootstrap |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    numbers["seed_statistics"] = {}
    for split in (s for s in SEED_ENDPOINT_SPLITS if s in grpo[0]):
        b = seed_matrix([r[split] for r in grpo], f"pass@{k_max}")
        clusters = None
        if split in CLUSTERS:
            tasks = {t.id: t for t in split_tasks(split)}
            clusters = [CLUSTERS[split](tasks[r.task_id]) for r in grpo[0][split].records]
        for method, per_seed in runs.items():
            if method == "GRPO" or len(per_seed) < 2 or split not in per_seed[0]:
                continue
            a = seed_matrix([r[split] for r in per_seed], f"pass@{k_max}")
            entry = {"method_seeds": seed_means(a).tolist(), "grpo_seeds": seed_means(b).tolist(),
                     "mean": float(a.mean() - b.mean()), "bootstrap": list(paired_difference_interval(a, b)),
                     "welch": list(welch_interval(a, b)), "permutation_p": permutation_p_value(a, b)}
            if clusters is not None:
                entry["cluster_bootstrap"] = list(cluster_paired_difference_interval(a, b, clusters))
                entry["clusters"] = len(set(clusters))
            numbers["seed_statistics"].setdefault(method, {})[f"{split} pass@{k_max} − GRPO"] = entry
            fmt = functools.partial(format_interval, entry["mean"], scale=100)
            lines.append(
                f"| {split} pass@{k_max} − GRPO | {method} | {', '.join(f'{100 * x:.1f}' for x in entry['method_seeds'])} | "
                f"{', '.join(f'{100 * x:.1f}' for x in entry['grpo_seeds'])} | {fmt(tuple(entry['bootstrap']))} | "
                f"{fmt(tuple(entry['welch']))} | {entry['permutation_p']:.2f} | "
                + (f"{fmt(tuple(entry['cluster_bootstrap']))} ({entry['clusters']} clusters)" if clusters else "—") + " |")
    return "\n".join(lines) if numbers["seed_statistics"] else ""


def shape_parts(style: str) -> dict[str, str]:
    """The three parts of a countdown style ``"<operators>,p<parentheses>,<order>"``."""
    operators, parentheses, order = style.split(",")
    return {"operators": operators or "(none)", "parentheses": parentheses, "order": order}


def shapes_table(base: dict, runs: dict, split: str = "countdown", top: int = 6) -> tuple[str, dict]:
    """A Markdown table of the countdown solution shapes each method writes on ``split``: the share
    of samples with an answer expression by operator pattern (the base model's ``top`` most
    common, the rest as "other"), by parentheses written and by number order, and the number of
    distinct shapes, each with its 95 % bootstrap interval over prompts and seeds (a method's
    seeds' samples counted together)."""
    from rllib_dph.envs.reasoning_gym import NO_STYLE
    from rllib_dph.evaluation.intervals import bootstrap_interval, format_interval

    methods = [("Base model", [base])] + [(m, seeds) for m, seeds in runs.items() if split in seeds[0]]

    def parts(results, part):  # (S, P, K) counts of each value of one part, and the values
        records = [r[split].records for r in results]
        values = sorted({shape_parts(s)[part] for rs in records for r in rs for s in r.styles if s != NO_STYLE})
        counts = np.array([[[sum(1 for s in r.styles if s != NO_STYLE and shape_parts(s)[part] == v) for v in values]
                            for r in rs] for rs in records], dtype=float)
        return counts, values

    base_ops, ops = parts([base], "operators")
    common = [ops[i] for i in np.argsort(-base_ops.sum(axis=(0, 1)))[:top]]
    columns = [("operators", v) for v in common] + [("operators", "other")]
    columns += [("parentheses", v) for v in ("p0", "p1", "p2")] + [("order", v) for v in ("given", "ascending", "descending", "mixed")]
    lines = [f"| method | {' | '.join(f'`{v}`' if part == 'operators' and v != 'other' else v for part, v in columns)} | distinct shapes |",
             "|" + " --- |" * (len(columns) + 2)]
    data = {}
    for name, results in methods:
        texts, data[name] = [], {}
        for part, value in columns:
            counts, values = parts(results, part)
            if part == "operators":
                keep = [values.index(v) for v in common if v in values]
                pick = (np.array([values.index(value)]) if value in values else np.array([], dtype=int)) if value != "other" \
                    else np.array([i for i in range(len(values)) if i not in keep], dtype=int)
            else:
                pick = np.array([values.index(value)]) if value in values else np.array([], dtype=int)

            def share(p, s, counts=counts, pick=pick):
                pooled = counts[np.ix_(s, p)].sum(axis=(0, 1))
                return float(pooled[pick].sum() / pooled.sum()) if pooled.sum() else math.nan

            all_p, all_s = np.arange(counts.shape[1]), np.arange(counts.shape[0])
            value_share = share(all_p, all_s)
            ci = bootstrap_interval(share, counts.shape[1], counts.shape[0])
            data[name][f"{part}={value}"] = {"mean": value_share, "ci95": list(ci)}
            texts.append(format_interval(value_share, ci, scale=100))
        distinct = len({s for r in results for rec in r[split].records for s in rec.styles if s != NO_STYLE})
        data[name]["distinct shapes"] = distinct
        lines.append(f"| {name} | " + " | ".join(texts) + f" | {distinct} |")
    return "\n".join(lines), data


def plots(base: dict, runs: dict, out: pathlib.Path) -> None:
    """The figures of every seed of ``--seeds`` pooled, as the tables pool them (the mean over
    seeds and prompts, bands that redraw both): pass@k curves and per-style pass@k bars for every
    evaluated split (`pass_at_k[_<split>].png`, `style_pass_at_k[_<split>].png`; in-domain
    unsuffixed), the style shares of the entropy splits like the paper's Figure 4
    (`styles[_<split>].png`), and every run's training reward per iteration (`train_reward.png`)."""
    from rllib_dph.evaluation import plot_pass_at_k, plot_style_pass_at_k

    for split in base:
        suffix = "" if split == "in-domain" else f"_{split.split()[0]}"
        results = [base[split]] + [[seed[split] for seed in seeds] for seeds in runs.values()]
        plot_pass_at_k(results, out / f"pass_at_k{suffix}.png")
        if base[split].solution_styles() or any(seed[split].solution_styles() for seeds in runs.values() for seed in seeds):
            plot_style_pass_at_k(results, out / f"style_pass_at_k{suffix}.png")
    for split in (s for s in ENTROPY_SPLITS if s in base):
        style_shares(base, runs, split, out / ("styles.png" if split == "in-domain" else f"styles_{split}.png"))
    train_rewards(out, out / "train_reward.png")


def train_rewards(out: pathlib.Path, out_png: pathlib.Path, window: int = 5) -> None:
    """Every run's training reward per iteration (its ``train_reward.json``) and its moving mean
    over ``window`` iterations, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {path.parent.name: json.loads(path.read_text()) for path in sorted((out / "runs").glob("*/train_reward.json"))}
    if not curves:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        x = np.arange(1, len(curve) + 1)
        line, = ax.plot(x, curve, alpha=0.3)
        if len(curve) >= window:
            ax.plot(x[window - 1:], np.convolve(curve, np.ones(window) / window, mode="valid"), color=line.get_color(),
                    label=f"{name} (mean of {window})")
    ax.set_xlabel("iteration")
    ax.set_ylabel("training reward (mean over the batch)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


def style_shares(base: dict, runs: dict, split: str, out_png: pathlib.Path) -> None:
    """Bars of how often each SQL style is sampled on ``split``, per method, its seeds' samples counted together."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["Base model"] + list(runs)
    counts = [base[split].style_counts()] + [_pooled_style_counts([seed[split] for seed in seeds]) for seeds in runs.values()]
    styles = sorted({s for c in counts for s in c if s != "none"})
    if not styles:
        return  # no completion had an answer block: nothing to draw
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(styles)
    for j, style in enumerate(styles):
        shares = [c.get(style, 0) / max(1, sum(v for s, v in c.items() if s != "none")) for c in counts]
        ax.bar(np.arange(len(labels)) + j * width, shares, width, label=style)
    ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=20, ha="right")
    ax.set_ylabel("share of sampled SQL solutions")
    num_seeds = sorted({len(seeds) for seeds in runs.values()})
    ax.set_title(f"Solution styles on the {split} test split ({'/'.join(map(str, num_seeds))} seeds per method)")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


def _pooled_style_counts(results: list) -> dict:
    """Number of sampled completions per solution style over every result (a method's seeds)."""
    from collections import Counter

    return dict(sum((Counter(r.style_counts()) for r in results), Counter()))


#: The family of each budget whose pass@64-along-training curve ``--curve`` draws.
CURVE_FAMILIES = {"ties": "ties", "ties-quick": "ties", "nulls": "nulls"}


def curve_command(budget: str) -> list[str]:
    """The command that draws pass@64 against training iterations for GRPO and DPH-JS on
    ``budget``'s family: ``research/collapse_search.py --curve``, which trains its
    own runs (seed 0, 100 iterations of the budget's settings) and evaluates the first 100
    prompts of the family's test split every 20 iterations (~8 min on 2 cores for the ties family)."""
    return [sys.executable, str(REPO / "research/collapse_search.py"), "--curve", "--family", CURVE_FAMILIES[budget]]


def run_all(out: pathlib.Path, args, t0: float) -> list[tuple]:
    """Trains and evaluates every run of the budget on ``args.workers`` processes; returns the
    runs as (method, seed, folder), the base model's first (method None).

    First the base model's evaluations and every run's training (a run with every split
    evaluated is skipped: :func:`missing_splits`); each run's evaluations, one job per split,
    are queued as its training ends, behind the trainings still waiting, so that the last jobs
    are single evaluations and the workers finish within about one evaluation of each other.
    """
    runs = [(None, 0, out / "base")] + [
        (method, seed, out / "runs" / f"{method}_seed{seed}") for method in args.methods for seed in args.seeds
    ]
    with worker_pool(args.workers) as pool:
        def evaluations(method, seed, run_dir, splits):
            return {pool.submit(evaluate, method, seed, str(run_dir), split, args) for split in splits}

        pending, then = set(), {}  # then: a training's evaluations, queued when it ends
        for method, seed, run_dir in runs:
            splits = missing_splits(run_dir, args.splits)
            if method is None:
                pending |= evaluations(method, seed, run_dir, splits)
            elif splits:
                future = pool.submit(train, method, seed, str(run_dir), args)
                then[future] = (method, seed, run_dir, splits)
                pending.add(future)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                print(f"[{time.perf_counter() - t0:6.0f}s] {future.result()}", flush=True)
                if future in then:
                    pending |= evaluations(*then.pop(future))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", choices=list(BUDGETS), default="full",
                        help="full (3 seeds, all prompts), quick (1 seed, ~7 min), ties / ties-quick (the pre-registered "
                        "comparison on the ties family and its quick mode), smollm2-cpu (the real "
                        "model on 2 CPU cores, ~70 min), smollm2-ties-cpu (the real model on the ties family) or "
                        "smollm2-lora-cpu (GRPO and DPH-JS with LoRA on the real model), smollm2-ties-gpu (the real model "
                        "on the ties family on one GPU), smollm2-600-ties-gpu / -cpu (the same on the 5x longer warm start), "
                        "nulls (the pre-registered comparison on the NULL family, ~45 min), smollm2-nulls-cpu / -gpu "
                        "(the real model on the NULL family), smollm2-600-nulls-cpu / -gpu (on the 5x longer warm start), "
                        "countdown-collapse / countdown / countdown-quick (reasoning-gym's countdown: the collapse search, "
                        "the pre-registered comparison and its quick mode), smollm2-countdown-cpu-collapse / smollm2-countdown-cpu "
                        "(the same on SmolLM2's countdown warm start, 2 CPU cores); "
                        "the flags below override any budget's values")
    parser.add_argument("--quick", action="store_true", help="the same as --budget quick")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--eval-limit", type=int, help="evaluate the first N prompts of each split (full: all)")
    parser.add_argument("--n", type=int)
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), help="default: the paper's six methods (ties: GRPO, DAPO, RKL, DPH-F, DPH-JS, DPH-JS (refine); smollm2-cpu: "
                        "GRPO, RKL, DPH-F, DPH-JS)")
    parser.add_argument("--config", default="{}", help="config overrides for every run, as JSON (over the budget's)")
    parser.add_argument("--splits", nargs="+", choices=list(SPLITS),
                        help="evaluation splits (default: in-domain, cross-domain, math; ties budgets: all four)")
    parser.add_argument("--max-new-tokens", type=int, help="evaluation response length (default 64; ties: 96)")
    parser.add_argument("--workers", type=int,
                        help="runs trained and evaluated at once, each in its own process with one thread (default 2)")
    parser.add_argument("--eval-device", help="device of the evaluations (default cpu; smollm2-ties-gpu: cuda)")
    parser.add_argument("--eval-dtype", help="dtype of the evaluations (default: the model's; smollm2-ties-gpu: bfloat16)")
    parser.add_argument("--out", help="output folder (default research/out/reproduce_dph[_<budget>]); "
                        "runs and evaluations already there are reused")
    parser.add_argument("--curve", action="store_true",
                        help="then draw pass@64 against training iterations for GRPO and DPH-JS on the budget's family "
                        f"(research/collapse_search.py --curve; budgets {', '.join(CURVE_FAMILIES)})")
    args = parser.parse_args()
    if args.quick:
        args.budget = "quick"
    if args.curve and args.budget not in CURVE_FAMILIES:
        parser.error(f"--curve draws a family's curve; --budget {args.budget} has none (use one of {list(CURVE_FAMILIES)}).")
    budget = dict(BUDGETS[args.budget])
    args.overrides = {**budget.pop("config", {}), **json.loads(args.config)}
    budget.setdefault("methods", PAPER_METHODS)
    budget.setdefault("splits", list(SPLITS)[:4] if args.budget.startswith("ties") else list(SPLITS)[:3])
    budget.setdefault("max_new_tokens", 64)
    budget.setdefault("workers", 2)
    budget.setdefault("eval_device", "cpu")
    for key, value in budget.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    suffix = "" if args.budget == "full" else f"_{args.budget}"
    out = pathlib.Path(args.out or REPO / f"research/out/reproduce_dph{suffix}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    jobs = run_all(out, args, t0)
    # Every run's evaluation is cached on disk now: read them back.
    base = load_results(out / "base", args.splits)
    runs = {method: [load_results(run_dir, args.splits) for m, _, run_dir in jobs if m == method]
            for method in args.methods}
    table, numbers = tables(base, runs, args)
    for line in primary_endpoints(numbers, args.n):
        table = f"{line}\n\n{table}"
    shape = run_config(args.methods[0], args)
    budget = (
        f"Budget ({args.budget}): {shape.model_name}, {args.iterations} iterations x {shape.prompts_per_step} "
        f"prompts x {shape.group_size} completions per run (lr {shape.lr:g}, training data "
        f"{shape.env_config.get('data') or json.dumps(shape.env_config)}), seeds {args.seeds}; "
        f"evaluation on {'all' if args.eval_limit is None else f'the first {args.eval_limit}'} prompts of each "
        f"split, n={args.n} samples at "
        f"temperature 1.0 plus one greedy sample; {args.workers} worker processes. "
        f"This invocation took {time.perf_counter() - t0:.0f} s (runs and evaluations already on disk are reused)."
    )
    text = f"{budget}\n\nAll numbers in %, except the style entropy.\n\n{table}\n"
    (out / "results.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"args": vars(args), "numbers": numbers}, indent=1, default=str))
    plots(base, runs, out)
    print("\n" + text)
    print(f"wrote {out / 'results.md'} and the figures (pass_at_k*.png, style_pass_at_k*.png, styles*.png) in {out}")
    if args.curve:
        subprocess.run(curve_command(args.budget), check=True)


if __name__ == "__main__":
    main()
