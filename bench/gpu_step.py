"""The learner update and HF-engine generation on one device (GPU or CPU), in bf16 and fp32.

Part 1, learner: the real GRPO learner (``GRPOConfig.build_learner``; on a GPU with
``.learners(num_gpus_per_learner=1)``) on a synthetic batch whose μ is the model's own
teacher-forced log-prob (an on-policy first epoch). Per model, dtype and batch shape: a finite
loss; which parameter tensors, and which share of their elements, the first update (lr 1e-5)
changed; the master-weight, Adam-state and compute dtypes (``--dtypes`` are
``GRPOConfig.llm(dtype=...)`` values: ``bfloat16`` is mixed precision, float32 master weights and
Adam state under bf16 autocast); the parameters' device; whether the module's weights survive
``get_state``/``set_state`` in their dtype and the learner's full ``get_state()`` works; seconds
per update (median of ``--iters`` after one warm-up), tokens/s and peak GPU memory.

Part 2, generation: a rollout engine (``engines.make_engine``; ``--modes``: the HF engine eager
or compiled, or the vLLM engine in-process; pure bf16 weights under ``bfloat16``) samples
``--gen-rows`` rows (prompts × ``--n``) of ``--max-new-tokens`` tokens; it reports generated
tokens/s (median of ``--gen-iters`` calls after a warm-up) and the gap between the engine's μ
and a teacher-forced recompute of the same tokens by the learner's code path
(``rl_module.next_token_logits`` + ``sequence_logprobs``, right-padded, no KV cache) with the
same weights in the same dtype, and for bf16 also with those weights in fp32.

Models: ``tiny-sql-math`` (the bundled model, resolved through ``$RLLIB_DPH_HOME``), the
random-weight Qwen2 sizes of ``bench/engines.py`` (``tiny``, ``100m``), or a model directory.
Nothing is asserted; the tables are the output.

    python bench/gpu_step.py                                     # GPU: tiny-sql-math and 100m
    python bench/gpu_step.py --device cpu --models tiny-sql-math --shapes 16x16+16 \\
        --iters 1 --gen-rows 16 --max-new-tokens 8 --dtypes float32
    python bench/gpu_step.py --json out.json --ray-init          # also start a local Ray first

On a GPU, RLlib's device lookup for a local learner (``ray.air``'s device manager) starts a
local Ray instance; unless ``--ray-init`` is given it is answered with ``cuda:0`` directly, and
the learner is built and updated as without the shortcut.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import pathlib
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


# --------------------------------------------------------------------------------------------
# Timing, models and batches


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def value(x) -> float:
    """A logged metric (RLlib ``Stats``, tensor or number) as a float."""
    if hasattr(x, "peek"):
        x = x.peek()
    if torch.is_tensor(x):
        x = x.detach().float().cpu().item()
    return float(x)


def model_dirs(names: list[str], tmp: pathlib.Path) -> dict[str, str]:
    """Model name → something ``resolve_model`` loads (random sizes are saved under ``tmp``)."""
    from engines import SIZES, save_random_model  # bench/engines.py

    out = {}
    for name in names:
        if name in SIZES:
            # bf16 files on a GPU: half the bytes to write and read for the 1.5B model; the
            # cases load them in their own dtype.
            dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
            out[name] = str(save_random_model(name, tmp / name, dtype))
        else:
            out[name] = name  # bundled tiny name, local directory or HF id
    return out


def dtype_names(tensors) -> str:
    """``"float32"``, ``"bfloat16,float32"``, ...: the dtypes among ``tensors`` (or dtypes)."""
    return ",".join(sorted({str(getattr(t, "dtype", t)).replace("torch.", "") for t in tensors}))


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"64x48+64"`` → (rows, prompt tokens, response tokens)."""
    rows, rest = text.split("x")
    prompt, response = rest.split("+")
    return int(rows), int(prompt), int(response)


def use_local_gpu_without_ray(device: torch.device) -> None:
    """Answers RLlib's accelerator lookup for the local learner without starting Ray.

    ``ray.rllib.utils.framework.get_device`` imports ``get_devices`` at call time; outside a Ray
    actor it only checks the list's length and then uses ``config.local_gpu_idx``.
    """
    import ray.air._internal.torch_utils as torch_utils

    torch_utils.get_devices = lambda: [device]


# --------------------------------------------------------------------------------------------
# Part 1: learner update


@torch.no_grad()
def on_policy_behavior_logp(module, batch: dict, device: torch.device, chunk: int = 32) -> np.ndarray:
    """(B, L) teacher-forced log-probs of the module's current weights, 0 outside responses."""
    from rllib_dph import columns as C
    from rllib_dph.policy.rl_module import LOGP

    out = []
    for s in range(0, len(batch[C.INPUT_IDS]), chunk):
        keys = (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)
        part = {k: torch.as_tensor(batch[k][s : s + chunk], device=device) for k in keys}
        out.append(module._forward_train(part)[LOGP].float().cpu().numpy())
    return (np.concatenate(out) * batch[C.RESPONSE_MASK]).astype(np.float32)


def learner_case(model: str, dtype: str, shape: tuple[int, int, int], device: torch.device, iters: int) -> dict:
    from rllib_dph.envs.base import Task, Verdict, VerifierEnv
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from transformers import AutoConfig

    from rllib_dph import columns as C
    from rllib_dph.algorithms.grpo import GRPOConfig
    from rllib_dph.models.build.prepare import prepare_model

    rows, prompt, response = shape
    config = (
        GRPOConfig()
        .llm(model_name=model, dtype=dtype, max_response_length=response)
        .training(group_size=8, prompts_per_step=max(1, rows // 8), minibatch_size=rows, lr=1e-5)
        .learners(num_gpus_per_learner=1 if device.type == "cuda" else 0)
        .debugging(seed=0)
    )
    env = VerifierEnv([Task("t", "x", ({"role": "user", "content": "q"},), "a")], lambda completion, ground_truth: Verdict(0.0, False))
    reset_peak(device)
    learner = config.build_learner(env=env)
    module = learner.module[DEFAULT_MODULE_ID]
    hf = module.model
    vocab = AutoConfig.from_pretrained(prepare_model(model).location).vocab_size
    first = next(hf.parameters())
    r = {
        "model": model, "dtype": dtype, "rows": rows, "prompt": prompt, "response": response,
        "learner_device": str(learner._device), "param_device": str(first.device),
        "master_dtype": dtype_names(hf.parameters()),
        "params_m": sum(p.numel() for p in hf.parameters()) / 1e6,
    }
    from reference_model_cost import synthetic_batch  # bench/reference_model_cost.py

    batch = synthetic_batch(rows, vocab, prompt=prompt, response=response)
    batch[C.BEHAVIOR_LOGP] = on_policy_behavior_logp(module, batch, learner._device)
    ma = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=rows)

    def update():
        out = learner.update(batch=ma, num_epochs=1, minibatch_size=rows)
        sync(device)
        return out[DEFAULT_MODULE_ID]

    # Warm-up update, with the checks; the hook sees the logits of the learner's forward pass.
    logits_dtypes = set()
    hook = hf.get_output_embeddings().register_forward_hook(lambda mod, args, out: logits_dtypes.add(out.dtype))
    before = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    logged = update()
    hook.remove()
    after = hf.state_dict()
    r["compute_dtype"] = dtype_names(logits_dtypes)
    adam = learner.get_optimizer().state.values()
    r["adam_dtype"] = dtype_names(t for st in adam for k, t in st.items() if k != "step")
    r["total_loss"] = value(logged["total_loss"])
    r["loss_finite"] = math.isfinite(r["total_loss"])
    r["grad_norm"] = value(logged["gradients_default_optimizer_global_norm"])
    r["clip_fraction"] = value(logged["clip_fraction"])
    r["abs_prob_diff_max"] = value(logged["abs_prob_diff_max"])
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    r["params_changed"] = f"{len(changed)}/{len(before)}"
    moved = sum(int((before[k] != after[k]).sum()) for k in before)
    r["elements_changed"] = moved / sum(v.numel() for v in before.values())
    r["master_dtype_after"] = dtype_names(hf.parameters())
    del before

    # Module weights through get_state / set_state, in their dtype.
    state = learner.get_state(components="rl_module")["rl_module"][DEFAULT_MODULE_ID]
    state = {k: v.clone() for k, v in state.items()}
    r["state_dtypes"] = dtype_names(state.values())
    update()  # move the weights away from `state`
    learner.set_state({"rl_module": {DEFAULT_MODULE_ID: state}})
    restored = hf.state_dict()
    r["set_state_roundtrip"] = all(
        torch.equal(restored[k].cpu(), state[k]) and restored[k].dtype == state[k].dtype for k in state
    ) and all(v.device == first.device for v in restored.values())
    del state, restored

    # The learner's full state (module + optimizer), as a checkpoint takes it.
    try:
        full = learner.get_state()
        r["full_get_state"] = "ok (" + ",".join(sorted(full)) + ")"
        del full
    except Exception as err:  # noqa: BLE001 - reported, not raised
        r["full_get_state"] = f"FAILED {type(err).__name__}: {str(err).splitlines()[0][:80]}"

    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        update()
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    r["update_s"] = sec
    r["tokens_per_s"] = rows * (prompt + response) / sec
    r["response_tokens_per_s"] = rows * response / sec
    r["peak_mib"] = peak_mib(device)
    del learner, module, hf, ma, first, after, adam
    free(device)
    return r


# --------------------------------------------------------------------------------------------
# Part 2: HF-engine generation


@torch.no_grad()
def recompute(model, prompts, completions, temperature: float, device, chunk: int = 16):
    """Teacher-forced log-probs of each completion's tokens by the learner's code path."""
    from rllib_dph import columns as C
    from rllib_dph.policy.rl_module import next_token_logits, sequence_logprobs

    out = []
    for s in range(0, len(completions), chunk):
        part = list(zip(prompts[s : s + chunk], completions[s : s + chunk]))
        length = max(len(p) + len(c.token_ids) for p, c in part)
        ids = torch.zeros(len(part), length, dtype=torch.long)
        mask = torch.zeros(len(part), length, dtype=torch.long)
        for i, (p, c) in enumerate(part):
            seq = list(p) + c.token_ids.tolist()
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
        batch = {C.INPUT_IDS: ids.to(device), C.ATTENTION_MASK: mask.to(device)}
        logp = sequence_logprobs(next_token_logits(model, batch), batch, temperature).float().cpu()
        for i, (p, c) in enumerate(part):
            out.append(logp[i, len(p) : len(p) + len(c.token_ids)].numpy())
    return out


def gaps(mu: list[np.ndarray], ref: list[np.ndarray]) -> tuple[float, float]:
    diff = np.abs(np.concatenate(mu) - np.concatenate(ref))
    return float(diff.max()), float(diff.mean())


def generation_engine(model: str, dtype: str, device: torch.device, mode: str, args):
    """The rollout engine of ``mode`` and an HF model holding the same weights on ``device`` (the
    recompute's model and the weight sync's source): for ``eager`` and ``compiled`` the HF
    engine's own model; for ``vllm`` (in-process, ``--vllm-kwargs`` passed to ``vllm.LLM``, at
    most ``--gen-rows`` running rows) a separate load of the model folder."""
    from rllib_dph.engines import make_engine

    if mode != "vllm":
        engine = make_engine("hf", model, dtype=dtype, device=device, max_batch_size=args.gen_rows,
                             compile_decode=mode == "compiled")
        return engine, engine.model
    from transformers import AutoModelForCausalLM

    from rllib_dph.models.build.prepare import prepare_model

    engine = make_engine("vllm", model, dtype=dtype, device=device.type, max_num_seqs=args.gen_rows,
                         **json.loads(args.vllm_kwargs))
    hf = AutoModelForCausalLM.from_pretrained(prepare_model(model).location, dtype=getattr(torch, dtype)).to(device)
    return engine, hf


def generation_case(model: str, dtype: str, device: torch.device, args, mode: str = "eager") -> dict:
    """One engine on one model: the first full call's seconds (for ``compiled``: compilation and
    CUDA-graph capture), generated tokens/s (median of ``--gen-iters`` further calls), seconds of
    one weight sync (``update_weights`` with the model's full state dict as CPU tensors, median
    of 3) and μ's gap to a teacher-forced recompute."""
    from rllib_dph.engines.base import SamplingParams

    engine, hf = generation_engine(model, dtype, device, mode, args)
    vocab = hf.config.vocab_size
    num_prompts = max(1, args.gen_rows // args.n)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (num_prompts, args.prompt_len), generator=gen).tolist()
    params = SamplingParams(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
    sync(device)
    reset_peak(device)
    t0 = time.perf_counter()
    engine.generate(prompts, params)  # warm-up: the full shape (compiles it under ``compiled``)
    sync(device)
    first = time.perf_counter() - t0
    times, tokens = [], []
    for i in range(args.gen_iters):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, params)
        sync(device)
        times.append(time.perf_counter() - t0)
        tokens.append(sum(len(c.token_ids) for g in groups for c in g))
    sec = statistics.median(times)
    state = {k: v.detach().to("cpu", copy=True) for k, v in hf.state_dict().items()}
    sync_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        engine.update_weights(state)
        sync(device)
        sync_times.append(time.perf_counter() - t0)
    del state
    rows = [(prompts[i], c) for i, g in enumerate(groups) for c in g]
    row_prompts, comps = [p for p, _ in rows], [c for _, c in rows]
    mu = [c.logprobs for c in comps]
    r = {
        "model": model, "mode": mode, "dtype": dtype, "rows": len(rows), "prompt": args.prompt_len,
        "max_new_tokens": args.max_new_tokens,
        "params_m": sum(p.numel() for p in hf.parameters()) / 1e6,
        "param_dtype": str(next(hf.parameters()).dtype).replace("torch.", ""),
        "first_call_s": first, "gen_s": sec, "gen_tokens": int(statistics.median(tokens)),
        "tokens_per_s": statistics.median(t / s for t, s in zip(tokens, times)),
        "weight_sync_s": statistics.median(sync_times),
        "stopped_rows": sum(c.finish_reason == "stop" for c in comps),
        "peak_mib": peak_mib(device),
    }
    r["mu_vs_same_dtype_max"], r["mu_vs_same_dtype_mean"] = gaps(mu, recompute(hf, row_prompts, comps, args.temperature, device))
    if hf.dtype != torch.float32:
        hf32 = copy.deepcopy(hf).float()
        r["mu_vs_fp32_max"], r["mu_vs_fp32_mean"] = gaps(mu, recompute(hf32, row_prompts, comps, args.temperature, device))
        del hf32
    del engine, hf
    free(device)
    return r


# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="tiny-sql-math,100m", help="comma-separated (see module doc)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--parts", default="learner,generation")
    parser.add_argument(
        "--shapes", default="64x48+64,128x64+192",
        help="learner batches ROWSxPROMPT+RESPONSE (bench/memory.py estimates what fits)",
    )
    parser.add_argument("--iters", type=int, default=5, help="timed learner updates after 1 warm-up")
    parser.add_argument("--gen-rows", type=int, default=128)
    parser.add_argument("--n", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--gen-iters", type=int, default=3)
    parser.add_argument("--modes", default="eager",
                        help="comma-separated engines: eager and compiled (the HF engine without and with "
                             "compile_decode), vllm (the vLLM engine, in-process)")
    parser.add_argument("--vllm-kwargs", default="{}",
                        help='vllm.LLM arguments of the vllm mode, as JSON (on a GPU with the trimmed kit of '
                             'tools/offline_kit/vllm_kit.py: {"attention_config": {"backend": "TRITON_ATTN"}})')
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--ray-init", action="store_true", help="start a local Ray instance first")
    parser.add_argument("--json", default=None, help="also write all results to this file")
    args = parser.parse_args()

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device={device} ({name}) torch={torch.__version__} threads={torch.get_num_threads()}", flush=True)

    parts = args.parts.split(",")
    if "learner" in parts:
        import ray

        if args.ray_init:
            t0 = time.perf_counter()
            ray.init(include_dashboard=False, log_to_driver=False, num_gpus=1 if device.type == "cuda" else 0)
            print(f"ray.init: {time.perf_counter() - t0:.1f}s, resources {ray.cluster_resources()}", flush=True)
        elif device.type == "cuda":
            use_local_gpu_without_ray(device)
        print(f"ray={ray.__version__}", flush=True)

    results = {"device": name, "learner": [], "generation": []}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = model_dirs(args.models.split(","), pathlib.Path(tmp))
        if "learner" in parts:
            for label, path in dirs.items():
                for dtype in args.dtypes.split(","):
                    for shape in args.shapes.split(","):
                        try:
                            r = learner_case(path, dtype, parse_shape(shape), device, args.iters)
                        except Exception as err:  # noqa: BLE001 - one failed case must not hide the others
                            traceback.print_exc()
                            r = {"model": path, "dtype": dtype, "shape": shape, "error": f"{type(err).__name__}: {err}"}
                            free(device)
                        r["model"] = label
                        results["learner"].append(r)
                        print("learner", json.dumps(r), flush=True)
        if "generation" in parts:
            # Every model eager first: a slow compilation then costs only compiled cases.
            for mode in args.modes.split(","):
                for label, path in dirs.items():
                    for dtype in args.dtypes.split(","):
                        try:
                            r = generation_case(path, dtype, device, args, mode)
                        except Exception as err:  # noqa: BLE001
                            traceback.print_exc()
                            r = {"model": path, "mode": mode, "dtype": dtype, "error": f"{type(err).__name__}: {err}"}
                            free(device)
                        r["model"] = label
                        results["generation"].append(r)
                        print("generation", json.dumps(r), flush=True)
                        if args.json:  # each case as it ends: a part cut off by its time limit keeps the rest
                            pathlib.Path(args.json).write_text(json.dumps(results, indent=1))

    if "learner" in parts:
        print_learner(results["learner"], name, args)
    if "generation" in parts:
        print_generation(results["generation"], name, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


def print_learner(rows: list[dict], name: str, args) -> None:
    print(f"\n== learner update ({name}); median of {args.iters} updates after 1 warm-up, one mini-batch each;"
          " dtype = GRPOConfig.llm(dtype), bfloat16 = fp32 master weights + bf16 autocast")
    header = (f"{'model':<14}{'dtype':<9}{'params':>7}{'rows':>5}{'P+R':>8}{'s/update':>10}{'tok/s':>10}"
              f"{'resp tok/s':>11}{'peak MiB':>9}  {'loss':>8} finite changed  st.dtype roundtrip full get_state")
    print(header)
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<14}{r['dtype']:<9} {r['shape']}: {r['error'][:150]}")
            continue
        print(f"{r['model']:<14}{r['dtype']:<9}{r['params_m']:>6.1f}M{r['rows']:>5}{r['prompt']:>4}+{r['response']:<3}"
              f"{r['update_s']:>10.4f}{r['tokens_per_s']:>10.0f}{r['response_tokens_per_s']:>11.0f}{r['peak_mib']:>9.0f}"
              f"  {r['total_loss']:>8.4f} {str(r['loss_finite']):<6} {r['params_changed']:<8}{r['state_dtypes']:<9}"
              f"{str(r['set_state_roundtrip']):<10}{r['full_get_state']}")
        print(f"{'':<14}  on {r['learner_device']} (params {r['param_device']}; master {r['master_dtype']}, Adam "
              f"{r['adam_dtype']}, logits {r['compute_dtype']}); grad norm "
              f"{r['grad_norm']:.3g}, clip fraction {r['clip_fraction']:.3g}, |π−μ| max {r['abs_prob_diff_max']:.3g}, "
              f"share of parameter elements changed by the first update {r['elements_changed']:.3f}")


def print_generation(rows: list[dict], name: str, args) -> None:
    print(f"\n== generation ({name}); {args.gen_rows} rows = prompts x n={args.n}, prompt {args.prompt_len}, "
          f"max {args.max_new_tokens} new tokens, T={args.temperature}; median of {args.gen_iters} calls after a first")
    print(f"{'model':<14}{'mode':<9}{'dtype':<9}{'params':>7}{'rows':>5}{'tokens':>7}{'1st s':>7}{'s/call':>8}{'tok/s':>9}"
          f"{'sync s':>8}{'peak MiB':>9}{'|μ−recompute| max/mean':>26}{'|μ−fp32 recompute| max/mean':>30}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<14}{r.get('mode', ''):<9}{r['dtype']:<9} {r['error'][:150]}")
            continue
        fp32 = f"{r['mu_vs_fp32_max']:.2e}/{r['mu_vs_fp32_mean']:.2e}" if "mu_vs_fp32_max" in r else "-"
        print(f"{r['model']:<14}{r['mode']:<9}{r['dtype']:<9}{r['params_m']:>6.1f}M{r['rows']:>5}{r['gen_tokens']:>7}"
              f"{r['first_call_s']:>7.1f}{r['gen_s']:>8.3f}{r['tokens_per_s']:>9.0f}{r['weight_sync_s']:>8.3f}{r['peak_mib']:>9.0f}"
              f"{r['mu_vs_same_dtype_max']:>15.2e}/{r['mu_vs_same_dtype_mean']:.2e}{fp32:>30}")


if __name__ == "__main__":
    main()
