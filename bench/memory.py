"""What fits where, and how close the estimate is: per-learner memory of the policy update.

The estimate is ``rllib_dph.cli.memory`` (the same one the preflight of ``rllib train`` uses to
refuse a run that will not fit): parameters, gradients, Adam state, activations saved for the
backward pass, FSDP2's unsharded working set, autocast's bf16 weight copies, the vocab-sized
logits and the frozen reference model (GRPO with a KL penalty loads one; DPH-RL's stored
log-probs spare it; LoRA's π_ref is its own base), and LoRA's adapters. Its formulas are in that
module's docstring.

Three parts:

- the table (any size, nothing downloaded): parameter counts from the HF config built on the
  meta device (Qwen2.5-0.5B/1.5B/7B and Llama-3.1-8B shapes, from their public config.json
  values), per learner on a GPU at ``--tokens`` tokens per micro-batch (half of them response);
  then LoRA (the defaults) next to full fine-tuning on one GPU learner at 2k-32k tokens;
- ``--measured``: the tiny model and a random ~100M Qwen2 on CPU with 2 Ray learners (gloo),
  DDP and FSDP2, float32: the bytes each learner holds after one real update
  (``rllib_dph.learners.sharding.held_bytes``) next to the estimate's, and the activation bytes autograd
  saves in a real forward pass next to the estimate's;
- ``--ray-overhead``: the RSS of the ``rllib train`` driver (Tune and the algorithms imported) and of
  Ray's own processes (GCS, raylet, agents) once ``ray.init`` has started them, with nothing
  trained: ``memory.DRIVER_AND_RAY_BYTES``, which the memory check adds to every run's RAM;
- ``--rss``: the peak RSS of a learner process (``resource.getrusage(...).ru_maxrss`` of a fresh
  subprocess that builds one local learner and runs two updates on one batch; the second is the
  steady state, with Adam's state allocated) next to the estimated peak, with the error; "built"
  is the peak before the first update (imports and the learner: on tiny-random, the process
  runtime ``memory.RUNTIME_BYTES_CPU``).

    python bench/memory.py                       # table only
    python bench/memory.py --measured            # table + held bytes with 2 learners (~3 min)
    python bench/memory.py --ray-overhead        # RSS of the driver and Ray's own processes
    python bench/memory.py --rss tiny-sql-math:64:64:128:8 100m:16:64:128:8:bfloat16
        # MODEL:ROWS:PROMPT:RESPONSE:GROUP[:DTYPE][:ckpt][:kl][:lora]; MODEL is a model name or
        # folder, or 100m (a random-weight ~100M Qwen2, written to a temporary folder); lora: the
        # LoRA defaults (rllib_dph.policy.lora.LORA_DEFAULTS)
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

import numpy as np
import torch

GB = 1e9
GPU_GB = 80

# Public config.json shapes (hidden, intermediate, layers, heads, kv heads, vocab, tied).
ARCHS = {
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)),
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)),
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)),
}
MEASURED = {
    "tiny": dict(vocab_size=2048, hidden_size=192, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=True),
}


def hf_config(family: str, arch: dict):
    from transformers import LlamaConfig, Qwen2Config

    return (Qwen2Config if family == "qwen2" else LlamaConfig)(**arch, max_position_embeddings=4096)


@contextlib.contextmanager
def saved_tensor_bytes(model, params):
    """Counts bytes autograd saves (unique storages), split into those saved inside decoder
    layers and outside them: yields a dict filled on exit. Parameters and autocast's low-precision
    copies of them (2-D tensors of a parameter's shape, or its transpose) are not activations
    and are skipped."""
    counts, seen, inside = {"layer": 0, "outside": 0}, set(), [0]
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    weight_shapes = {shape for p in params if p.dim() == 2 for shape in (tuple(p.shape), tuple(p.shape)[::-1])}

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in seen and ptr not in param_ptrs and tuple(t.shape) not in weight_shapes:
            seen.add(ptr)
            counts["layer" if inside[0] else "outside"] += storage.nbytes()
        return t

    def enter(*_):
        inside[0] += 1

    def leave(*_):
        inside[0] -= 1

    hooks = []
    for layer in model.get_decoder().layers:
        hooks += [layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield counts
    finally:
        for hook in hooks:
            hook.remove()


def _token_batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0, group_size: int = 1) -> dict:
    """Random ``prompt + response`` rows; each run of ``group_size`` rows shares its prompt."""
    from rllib_dph import columns as C

    rng = np.random.default_rng(seed)
    prompts = rng.integers(3, vocab, (-(-rows // group_size), prompt)).repeat(group_size, 0)[:rows]
    ids = np.concatenate([prompts, rng.integers(3, vocab, (rows, response))], axis=1)
    response_mask = np.zeros_like(ids)
    response_mask[:, prompt:] = 1
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: np.ones_like(ids), C.RESPONSE_MASK: response_mask}


def _update_batch(rows: int, prompt: int, response: int, vocab: int, group_size: int) -> dict:
    """A learner batch: :func:`_token_batch` plus μ, advantages (+1/-1), groups and row types."""
    from rllib_dph import columns as C

    batch = _token_batch(rows, prompt, response, vocab, group_size=group_size)
    batch.update({
        C.BEHAVIOR_LOGP: (np.full(batch[C.INPUT_IDS].shape, -5.0) * batch[C.RESPONSE_MASK]).astype(np.float32),
        C.ADVANTAGES: np.resize([1.0, -1.0], rows).astype(np.float32),
        C.GROUP_IDS: np.arange(rows) // group_size, C.ROW_TYPE: np.zeros(rows, dtype=np.int64),
        C.REWARDS: np.zeros(rows, dtype=np.float32),
    })
    return batch


def activation_bytes(model, batch: dict, dtype: torch.dtype) -> dict:
    """Saved-tensor bytes of the learner's forward (ResponseLM + token_stats) on ``batch``."""
    from rllib_dph import columns as C
    from rllib_dph.losses.tokens import token_stats
    from rllib_dph.policy.rl_module import ResponseLM, autocast

    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    lm = ResponseLM(model)
    with saved_tensor_bytes(model, list(model.parameters())) as counts:
        with autocast(torch.device("cpu"), dtype):
            logits, where = lm.logits(tensors)
        logp, _, _ = token_stats(logits, tensors[C.INPUT_IDS][:, 1:][where], temperature=1.0)
        loss = -logp.mean()
    loss.backward()
    return counts




def shape_of(family: str, arch: dict):
    """The estimator's ``ModelShape`` of an architecture (meta device, nothing allocated)."""
    from rllib_dph.cli.memory import ModelShape

    return ModelShape.from_config(hf_config(family, arch))


def table_gb(shape, *, tokens: int, sharding: str, n: int, checkpointing: bool, reference: bool, lora=None) -> float:
    """Estimated GB per GPU learner: ``tokens`` per micro-batch, half of them response, bf16."""
    from rllib_dph.cli.memory import LearnerSetup, MicroBatch, learner_estimate

    batch = MicroBatch(rows=max(1, tokens // 1024), prompt=512, response=512)
    setup = LearnerSetup(dtype="bfloat16", sharding=sharding, num_learners=n, gradient_checkpointing=checkpointing,
                         reference=reference, lora=lora, device="cuda")
    return learner_estimate(shape, batch, setup).total / GB


LORA_TOKENS = (2048, 4096, 8192, 16384, 32768)


def print_lora_table() -> None:
    """LoRA (the defaults, ``lora.LORA_DEFAULTS``) on one GPU learner (DDP, N=1) at several
    micro-batch token budgets, with and without checkpointing, next to full fine-tuning; the
    same estimate with π_ref needed (GRPO+KL) since LoRA's π_ref costs nothing."""
    from rllib_dph.policy.lora import LORA_DEFAULTS
    from rllib_dph.cli.memory import adapter_params

    print(f"\nLoRA {LORA_DEFAULTS} on one GPU learner (DDP, bf16 compute, fp32 frozen base), GB per learner by "
          f"tokens per micro-batch (1024-token rows, half response); * = fits {GPU_GB} GB. 'full' is full "
          "fine-tuning without π_ref (DPH); with LoRA, GRPO+KL costs the same (π_ref = the base, adapters off).\n")
    print(f"{'model':<14}{'params':>8}{'adapters':>10}  {'method':<7}{'ckpt':<5}" + "".join(f"{t:>9}" for t in LORA_TOKENS))
    largest = {}
    for name, (family, arch) in ARCHS.items():
        shape = shape_of(family, arch)
        p_a = adapter_params(shape, LORA_DEFAULTS)
        for method, lora in (("LoRA", dict(LORA_DEFAULTS)), ("full", None)):
            for ckpt in (False, True):
                cells = []
                for tokens in LORA_TOKENS:
                    gb = table_gb(shape, tokens=tokens, sharding="ddp", n=1, checkpointing=ckpt, reference=False, lora=lora)
                    cells.append(f"{gb:>8.1f}{'*' if gb <= GPU_GB else ' '}")
                    if gb <= GPU_GB:
                        largest[(name, method, ckpt)] = tokens
                print(f"{name:<14}{shape.params / 1e9:>7.2f}B{p_a / 1e6:>9.1f}M  {method:<7}{'on' if ckpt else 'off':<5}"
                      + "".join(cells))
    print(f"\nLargest token budget (of {LORA_TOKENS}) with one learner within {GPU_GB} GB:")
    for name in ARCHS:
        cells = [f"{method} ckpt {'on' if ckpt else 'off'}: {largest.get((name, method, ckpt), 'none')}"
                 for method in ("LoRA", "full") for ckpt in (False, True)]
        print(f"  {name:<14}" + "; ".join(cells))


def print_table(args) -> None:
    print(f"Per-learner memory (GB) of one update on a GPU, bf16 compute, {args.tokens} tokens per micro-batch "
          f"(1024-token rows, half response); 'GRPO+KL' adds the fp32 reference model, 'DPH' has none.\n")
    print(f"{'model':<14}{'params':>8}  {'sharding':<7}{'ckpt':<5}" + "".join(f"{'N=' + str(n):>16}" for n in (1, 2, 4, 8)))
    print(f"{'':<34}" + "".join(f"{'DPH / GRPO+KL':>16}" for _ in (1, 2, 4, 8)))
    smallest = {}
    for name, (family, arch) in ARCHS.items():
        shape = shape_of(family, arch)
        for sharding in ("ddp", "fsdp2"):
            for ckpt in (False, True):
                cells = []
                for n in (1, 2, 4, 8):
                    if sharding == "fsdp2" and n == 1:
                        cells.append(f"{'-':>16}")
                        continue
                    dph, grpo = (table_gb(shape, tokens=args.tokens, sharding=sharding, n=n, checkpointing=ckpt,
                                          reference=ref) for ref in (False, True))
                    cells.append(f"{dph:>7.1f} / {grpo:<6.1f}")
                    for method, value in (("DPH", dph), ("GRPO+KL", grpo)):
                        if value <= GPU_GB and (name, method) not in smallest:
                            smallest[(name, method)] = f"{n} x {GPU_GB} GB ({sharding}, checkpointing {'on' if ckpt else 'off'})"
                print(f"{name:<14}{shape.params / 1e9:>7.2f}B  {sharding:<7}{'on' if ckpt else 'off':<5}" + "".join(cells))
    print(f"\nSmallest setup per model with every learner within {GPU_GB} GB (first hit in the order DDP, FSDP2; N = 1, 2, 4, 8):")
    for (name, method), where in smallest.items():
        print(f"  {name:<14}{method:<9}{where}")


def _learner_group(folder: str, rows: int, sharding: str, num_learners: int):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_dph.algorithms.grpo import GRPOConfig

    config = (
        GRPOConfig().environment("rllib_dph/SQL-v0").llm(model_name=folder, max_response_length=32)
        .training(group_size=4, prompts_per_step=rows // 4, lr=1e-4, grad_clip=1.0)
        .learners(num_learners=num_learners, num_cpus_per_learner=0.5, sharding=sharding)
    )
    return config.build_learner_group(env=None, spaces={DEFAULT_MODULE_ID: _spaces()})


def measured_check(args) -> None:
    """Held parameter / gradient / Adam bytes of 2 Ray learners and a full forward pass's saved
    activations, next to the estimate's."""
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rllib_dph import columns as C
    from rllib_dph.learners.splits import shard_groups
    from rllib_dph.cli.memory import LearnerSetup, MicroBatch, activation_bytes as estimated_activations, state_bytes
    from rllib_dph.learners.sharding import held_bytes

    rows = args.rows
    print(f"\nMeasured on CPU, float32, 2 learners (gloo), one update of {rows} rows x (32 prompt + 32 response) tokens:")
    print(f"{'model':<7}{'sharding':<9}{'params MB':>20}{'grads MB':>20}{'Adam MB':>20}{'activations MB':>22}")
    print(f"{'':<16}" + "".join(f"{'measured/estimate':>20}" for _ in range(3)) + f"{'measured/estimate':>22}")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for name, arch in MEASURED.items():
        folder = Path(tempfile.mkdtemp(prefix=f"memory-{name}-"))
        torch.manual_seed(0)
        Qwen2ForCausalLM(Qwen2Config(**arch, max_position_embeddings=512)).save_pretrained(folder)
        shape = shape_of("qwen2", arch)
        batch = _update_batch(rows, 32, 32, arch["vocab_size"], group_size=1)
        model = Qwen2ForCausalLM.from_pretrained(folder)
        half = {k: batch[k][: rows // 2] for k in (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)}
        counts = activation_bytes(model, half, torch.float32)
        measured_act = counts["layer"] + counts["outside"] - (rows // 2) * 32 * shape.vocab * 4  # minus saved logits
        predicted_act = estimated_activations(shape, MicroBatch(rows // 2, 32, 32), LearnerSetup())
        for sharding in ("ddp", "fsdp2"):
            group = _learner_group(str(folder), rows, sharding, 2)
            shards = shard_groups(batch, 2)
            group.update(batches=[MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(s)}, env_steps=len(s[C.INPUT_IDS])) for s in shards], num_minibatches=1)
            held = [r.get() for r in group.foreach_learner(held_bytes)][0]
            group.shutdown()
            est = state_bytes(shape, LearnerSetup(sharding=sharding, num_learners=2))
            pairs = ((held["parameters"], est["weights"]), (held["gradients"], est["gradients"]), (held["optimizer"], est["optimizer"]))
            cells = "".join(f"{m / 1e6:>10.1f} / {e / 1e6:<8.1f}" for m, e in pairs)
            print(f"{name:<7}{sharding:<9}{cells}{measured_act / 1e6:>11.1f} / {predicted_act / 1e6:<9.1f}")
    ray.shutdown()
    print("(activations: autograd's saved tensors in a forward pass of the full model on one learner's half of"
          " the rows, without the saved fp32 logits, next to rllib_dph.cli.memory.activation_bytes)")


def parse_rss_spec(spec: str) -> dict:
    """``MODEL:ROWS:PROMPT:RESPONSE:GROUP[:DTYPE][:ckpt][:kl][:lora]`` → the settings of one RSS
    run (``lora``: LoRA with ``lora.LORA_DEFAULTS``)."""
    parts = spec.split(":")
    if len(parts) < 5:
        raise SystemExit(f"--rss {spec!r}: expected MODEL:ROWS:PROMPT:RESPONSE:GROUP[:DTYPE][:ckpt][:kl][:lora]")
    model, rows, prompt, response, group, *flags = parts
    dtype = next((f for f in flags if f in ("float32", "bfloat16")), "float32")
    unknown = set(flags) - {"float32", "bfloat16", "ckpt", "kl", "lora"}
    if unknown:
        raise SystemExit(f"--rss {spec!r}: unknown flags {sorted(unknown)}; use float32, bfloat16, ckpt, kl, lora")
    from rllib_dph.policy.lora import LORA_DEFAULTS

    return dict(model=model, rows=int(rows), prompt=int(prompt), response=int(response), group_size=int(group),
                dtype=dtype, checkpointing="ckpt" in flags, kl="kl" in flags,
                lora=dict(LORA_DEFAULTS) if "lora" in flags else None)


def rss_config(run: dict):
    """The GRPO config of one RSS run: a local learner (``num_learners=0``) on CPU."""
    from rllib_dph.algorithms.grpo import GRPOConfig

    return (
        GRPOConfig().environment("rllib_dph/SQL-v0")
        .llm(model_name=run["model"], dtype=run["dtype"], max_response_length=run["response"],
             gradient_checkpointing=run["checkpointing"], lora=run["lora"])
        .training(group_size=run["group_size"], prompts_per_step=-(-run["rows"] // run["group_size"]), lr=1e-5,
                  kl_coeff=0.1 if run["kl"] else 0.0)
        .learners(num_learners=0)
    )


def rss_child(run: dict) -> None:
    """In a fresh process: build one local learner, run two updates on one batch, print the
    peak RSS (``ru_maxrss``) after each as JSON (the second update is the steady state)."""
    import json
    import resource

    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    torch.set_num_threads(1)
    group = rss_config(run).build_learner_group(env=None, spaces={DEFAULT_MODULE_ID: _spaces()})
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # imports + learner, before any update
    peaks = []
    for _ in range(2):
        batch = _update_batch(run["rows"], run["prompt"], run["response"], 2000, run["group_size"])
        group.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=run["rows"]), num_minibatches=1)
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux
    print(json.dumps({"peak_built": built, "peak_first_update": peaks[0], "peak": peaks[1]}))


def rss_check(specs: list[str]) -> None:
    """Estimated vs measured peak RSS of one CPU learner per spec (see the module docstring)."""
    import json
    import subprocess
    import sys
    import time

    from rllib_dph.cli.memory import LearnerSetup, MicroBatch, learner_estimate, model_shape

    print(f"{'run':<52}{'predicted GB':>13}{'measured GB':>12}{'error':>8}{'built GB':>9}{'time':>7}  estimate")
    for spec in specs:
        run = parse_rss_spec(spec)
        if run["model"] == "100m":
            from engines import save_random_model  # bench/engines.py

            run["model"] = str(save_random_model("100m", Path(tempfile.mkdtemp(prefix="memory-100m-"))))
        shape = model_shape(run["model"])
        setup = LearnerSetup(dtype=run["dtype"], gradient_checkpointing=run["checkpointing"], reference=run["kl"],
                             lora=run["lora"])
        estimate = learner_estimate(shape, MicroBatch(run["rows"], run["prompt"], run["response"], run["group_size"]), setup)
        start = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--rss-child", json.dumps(run)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{spec:<52} failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
            continue
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        peak = measured["peak"]
        error = 100 * (estimate.total - peak) / peak
        print(f"{spec:<52}{estimate.total / GB:>13.2f}{peak / GB:>12.2f}{error:>+7.1f}%{measured['peak_built'] / GB:>9.2f}"
              f"{time.perf_counter() - start:>6.0f}s  {estimate.summary()}", flush=True)


def _spaces():
    import gymnasium as gym

    return (gym.spaces.Text(1), gym.spaces.Text(1))


def ray_overhead_child() -> None:
    """Prints as JSON the RSS of the ``rllib train`` driver and of Ray's own processes, as the
    command starts them (``ray.init`` with 2 CPUs, no dashboard) with nothing trained yet."""
    import json
    import time

    import psutil
    import ray
    from ray import tune  # noqa: F401  (the driver runs Tune)

    import rllib_dph.algorithms  # noqa: F401  (and imports the algorithms)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    time.sleep(10)  # Ray's agents start after ray.init returns
    me = psutil.Process()
    rss = {"driver": me.memory_info().rss}
    for child in me.children(recursive=True):
        try:
            name = " ".join(child.cmdline()[:2])[:80] or child.name()
            if not child.name().startswith("ray::"):  # idle workers become the run's actors (counted there)
                rss[f"{child.pid} {name}"] = child.memory_info().rss
        except psutil.Error:
            continue
    ray.shutdown()
    print(json.dumps(rss))


def ray_overhead() -> None:
    """The driver's and Ray's own RSS (``memory.DRIVER_AND_RAY_BYTES``), measured in a fresh process."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, __file__, "--ray-overhead-child"], capture_output=True, text=True, check=True)
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    for name, value in sorted(rss.items(), key=lambda kv: -kv[1]):
        print(f"{value / GB:6.3f} GB  {name}")
    print(f"{sum(rss.values()) / GB:6.3f} GB  driver and Ray's own processes")


def main() -> None:
    import json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per micro-batch per learner (table)")
    parser.add_argument("--rows", type=int, default=16, help="rows of the --measured update (multiple of 8)")
    parser.add_argument("--measured", action="store_true", help="held bytes of 2 CPU learners (~3 min)")
    parser.add_argument("--rss", nargs="+", metavar="SPEC",
                        help="peak RSS runs, MODEL:ROWS:PROMPT:RESPONSE:GROUP[:DTYPE][:ckpt][:kl][:lora]")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--ray-overhead", action="store_true", help="RSS of the driver and Ray's own processes")
    parser.add_argument("--ray-overhead-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.rss_child:
        return rss_child(json.loads(args.rss_child))
    if args.ray_overhead_child:
        return ray_overhead_child()
    if args.ray_overhead:
        return ray_overhead()
    if args.rss:
        return rss_check(args.rss)
    print_table(args)
    print_lora_table()
    if args.measured:
        measured_check(args)


if __name__ == "__main__":
    main()
