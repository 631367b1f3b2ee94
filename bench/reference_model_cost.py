"""What DPH-RL's generator form saves: the cost of a live reference model in the learner.

RKL (GRPO + β·KL(π_θ‖π_ref)) keeps a frozen copy of the initial model in every learner and
runs it forward on every mini-batch. DPH-F / DPH-JS / α use log-probs stored once by the
pre-sampling stage instead, and add 1 D_pef row per 8 exploration rows. This measures, on the
same synthetic batch (prompt 48 + response 64 tokens per row), per variant in a fresh process:
learner update time and the process's peak resident memory.

    python bench/reference_model_cost.py                 # sizes tiny and 100m, 64 rows
    python bench/reference_model_cost.py --sizes 100m --rows 32
"""

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
PROMPT, RESPONSE = 48, 64
VARIANTS = {
    "GRPO (no reference)": {"kl_coeff": 0.0, "dph": False},
    "RKL (live reference model)": {"kl_coeff": 0.01, "dph": False},
    "DPH-JS (stored log-probs, +1/8 rows)": {"kl_coeff": 0.0, "dph": True},
}


def synthetic_batch(rows: int, vocab: int, seed: int = 0, prompt: int = PROMPT, response: int = RESPONSE) -> dict:
    """Exploration rows of random tokens in groups of 8 with random advantages (timing does not
    depend on the token values)."""
    from rllib_dph import columns as C

    rng = np.random.default_rng(seed)
    length = prompt + response
    response_mask = np.zeros((rows, length), dtype=np.int64)
    response_mask[:, prompt:] = 1
    return {
        C.INPUT_IDS: rng.integers(1, vocab, (rows, length)),
        C.ATTENTION_MASK: np.ones((rows, length), dtype=np.int64),
        C.RESPONSE_MASK: response_mask,
        C.BEHAVIOR_LOGP: np.full((rows, length), -5.0, dtype=np.float32),
        C.ADVANTAGES: rng.standard_normal(rows).astype(np.float32),
        C.REWARDS: np.zeros(rows, dtype=np.float32),
        C.CORRECT: np.zeros(rows, dtype=bool),
        C.TRUNCATED: np.zeros(rows, dtype=bool),
        C.GROUP_IDS: np.arange(rows) // 8,
        C.PROMPT_LENGTH: np.full(rows, prompt),
        C.RESPONSE_LENGTH: np.full(rows, response),
        C.ROW_TYPE: np.full(rows, C.ROW_TYPE_EXP),
    }


def write_pef_file(model_dir: str, path: pathlib.Path, vocab: int, rows: int = 64) -> None:
    """A D_pef file in the pre-sampling layout, stamped with the model's fingerprint."""
    import pyarrow as pa

    from rllib_dph.models.hub import model_fingerprint
    from rllib_dph.algorithms.dph.presample import META_PREFIX, _write_parquet

    rng = np.random.default_rng(1)
    table = pa.table({
        "prompt_ids": [rng.integers(1, vocab, PROMPT).tolist() for _ in range(rows)],
        "response_ids": [rng.integers(1, vocab, RESPONSE).tolist() for _ in range(rows)],
        "ref_logp": [[-5.0] * RESPONSE for _ in range(rows)],
    })
    _write_parquet(table, path, {META_PREFIX + "model_fingerprint": model_fingerprint(model_dir)})


def run_variant(name: str, model_dir: str, rows: int) -> dict:
    """Runs in a child process: builds the real learner, times updates, reads peak RSS."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from transformers import AutoConfig

    from rllib_dph.envs.base import Task, Verdict, VerifierEnv
    from rllib_dph.algorithms.dph import DPHConfig
    from rllib_dph.algorithms.grpo import GRPOConfig

    torch.set_num_threads(2)
    variant = VARIANTS[name]
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    config = DPHConfig() if variant["dph"] else GRPOConfig()
    config.llm(model_name=model_dir, max_response_length=RESPONSE)
    config.training(kl_coeff=variant["kl_coeff"], group_size=8, prompts_per_step=max(1, rows // 8))
    if variant["dph"]:
        pef = pathlib.Path(model_dir) / "d_pef.parquet"
        write_pef_file(model_dir, pef, vocab)
        config.dph(pef_path=str(pef), divergence="js", pef_coeff=0.2)
    env = VerifierEnv([Task("t", "x", ({"role": "user", "content": "q"},), "a")], lambda completion, ground_truth: Verdict(0.0, False))
    learner = config.build_learner(env=env)
    ma = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(synthetic_batch(rows, vocab))}, env_steps=rows)

    def update():
        # The DPH learner appends its D_pef rows itself; one mini-batch holds all rows.
        return learner.update(batch=ma, num_epochs=1, minibatch_size=rows + rows // 8)

    update()  # warm-up
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        update()
        times.append(time.perf_counter() - t0)
    ref = learner.ref_model
    ref_bytes = sum(p.numel() * p.element_size() for p in ref.parameters()) if ref is not None else 0
    return {
        "update_s": float(np.median(times)),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "reference_param_mib": ref_bytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,100m")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child[0], args.child[1], args.rows)))
        return

    sys.path.insert(0, str(REPO / "bench"))
    from engines import save_random_model

    print(f"learner update on {args.rows} exploration rows of {PROMPT}+{RESPONSE} tokens, fp32, CPU")
    print(f"{'model':<8}{'variant':<38}{'update s':>10}{'peak RSS MiB':>14}{'ref params MiB':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            model_dir = save_random_model(size, pathlib.Path(tmp) / size)
            for name in VARIANTS:
                out = subprocess.run(
                    [sys.executable, __file__, "--rows", str(args.rows), "--child", name, str(model_dir)],
                    capture_output=True, text=True, check=True,
                )
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{size:<8}{name:<38}{r['update_s']:>10.2f}{r['peak_rss_mib']:>14.0f}{r['reference_param_mib']:>16.1f}")


if __name__ == "__main__":
    main()
