"""What fits where: per-learner memory of the policy update under DDP and FSDP2.

Per learner it counts parameters, gradients, Adam state, activations saved for the backward
pass, FSDP2's unsharded working set, autocast's bf16 weight copies and the frozen reference
model (GRPO with a KL penalty loads one; DPH-RL and GRPO without KL do not).

Analytic part (any size, nothing downloaded): parameter counts come from the HF config built
on the meta device (Qwen2.5-0.5B/1.5B/7B and Llama-3.1-8B shapes, from their public
config.json values). Activation bytes per token come from a real forward pass of a one-layer
model of the same width (random weights, 128 tokens, half of them response, the learner's own
``ResponseLM`` + ``token_stats`` under bf16 autocast), counting the tensors autograd saves
inside the decoder layer (per layer) and outside it (embeddings, LM head, log-softmax: per
response token). Then per learner, with T tokens per micro-batch (``--tokens``):

    DDP:    16·P (fp32 weights, grads, Adam m and v) + 2·P_mm (autocast's bf16 weight copies)
    FSDP2:  16·P/N + 2·(2·P_layer) + 2·P_root + 4·max(P_layer, P_root)   (bf16 gathers of the
            current and prefetched layer, the root unit, one unit's fp32 gradients)
    act:    T·L·a_layer + T_resp·a_head           (no checkpointing)
            T·L·4·H + T·a_layer + T_resp·a_head    (checkpointing: fp32 layer inputs, one
                                                    layer recomputed at a time)
    π_ref:  4·P (DDP) or 4·P/N + 2·2·P_layer + 2·P_root (FSDP2), fp32 so the KL starts at 0

Measured part: the tiny model and a random ~100M Qwen2 on CPU with 2 Ray learners (gloo),
DDP and FSDP2, float32: the bytes each learner holds after one real update
(``rllib_dph.sharding.held_bytes``) next to the formula's, and the activation bytes of a real
forward pass next to the formula's. A GPU run (0.5B and 1.5B, 2 learners sharing one GPU) is
not part of this script yet.

    python bench/memory.py                  # table + measured check (~3 min on 2 cores)
    python bench/memory.py --skip-measured  # table only
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


def param_counts(config) -> dict:
    """P (unique parameters), P_layer (one decoder layer), P_root (the rest), P_mm (matmul weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    layer = sum(p.numel() for p in model.get_decoder().layers[0].parameters())
    embed = model.get_input_embeddings().weight.numel()
    return {"P": total, "P_layer": layer, "P_root": total - config.num_hidden_layers * layer, "P_mm": total - embed + (embed if config.tie_word_embeddings else 0)}


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


def _token_batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0) -> dict:
    from rllib_dph import columns as C

    rng = np.random.default_rng(seed)
    length = prompt + response
    ids = rng.integers(3, vocab, (rows, length))
    response_mask = np.zeros((rows, length), dtype=np.int64)
    response_mask[:, prompt:] = 1
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: np.ones_like(ids), C.RESPONSE_MASK: response_mask}


def activation_bytes(model, batch: dict, dtype: torch.dtype) -> dict:
    """Saved-tensor bytes of the learner's forward (ResponseLM + token_stats) on ``batch``."""
    from rllib_dph import columns as C
    from rllib_dph.losses import token_stats
    from rllib_dph.rl_module import ResponseLM, autocast

    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    lm = ResponseLM(model)
    with saved_tensor_bytes(model, list(model.parameters())) as counts:
        with autocast(torch.device("cpu"), dtype):
            logits, where = lm.logits(tensors)
        logp, _, _ = token_stats(logits, tensors[C.INPUT_IDS][:, 1:][where], temperature=1.0)
        loss = -logp.mean()
    loss.backward()
    return counts


def per_token_activations(family: str, arch: dict, *, tokens: int = 128, dtype=torch.bfloat16) -> dict:
    """a_layer (bytes per token per layer) and a_head (bytes per response token), measured on a
    one-layer model of ``arch``'s width."""
    from transformers import AutoModelForCausalLM

    config = hf_config(family, {**arch, "num_hidden_layers": 1})
    torch.manual_seed(0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.tie_weights()
    if not config.tie_word_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)  # saves no activation, spares its gradient
    # Rotary buffers were created on the meta device: recompute them.
    for module in model.modules():
        if hasattr(module, "inv_freq") and hasattr(module, "rope_init_fn"):
            inv_freq, _ = module.rope_init_fn(module.config, torch.device("cpu"))
            module.inv_freq = inv_freq
            module.original_inv_freq = inv_freq
    half = tokens // 2
    counts = activation_bytes(model, _token_batch(1, half, half, arch["vocab_size"]), dtype)
    return {"a_layer": counts["layer"] / tokens, "a_head": counts["outside"] / half}


def learner_bytes(counts: dict, acts: dict, hidden: int, layers: int, *, sharding: str, n: int,
                  tokens: int, checkpointing: bool, reference: bool, bf16: bool = True) -> float:
    """Per-learner bytes of the update by the formulas in the module docstring."""
    P, P_layer, P_root = counts["P"], counts["P_layer"], counts["P_root"]
    half = 2 if bf16 else 4
    if sharding == "ddp":
        states = 16 * P + (2 * counts["P_mm"] if bf16 else 0)
        ref = 4 * P
    else:
        work = 2 * half * P_layer + half * P_root + 4 * max(P_layer, P_root)
        states = 16 * P / n + work
        ref = 4 * P / n + 2 * half * P_layer + half * P_root
    response = tokens // 2
    if checkpointing:
        act = tokens * layers * 4 * hidden + tokens * acts["a_layer"] + response * acts["a_head"]
    else:
        act = tokens * layers * acts["a_layer"] + response * acts["a_head"]
    return states + act + (ref if reference else 0)


def print_table(args) -> None:
    print(f"Per-learner memory (GB) of one update, bf16 compute, {args.tokens} tokens per micro-batch "
          f"(half response); 'GRPO+KL' adds the fp32 reference model, 'DPH' has none.\n")
    header = f"{'model':<14}{'params':>8}  {'sharding':<7}{'ckpt':<5}" + "".join(f"{'N=' + str(n):>16}" for n in (1, 2, 4, 8))
    print(header)
    print(f"{'':<34}" + "".join(f"{'DPH / GRPO+KL':>16}" for _ in (1, 2, 4, 8)))
    smallest = {}
    for name, (family, arch) in ARCHS.items():
        counts = param_counts(hf_config(family, arch))
        acts = per_token_activations(family, arch)
        for sharding in ("ddp", "fsdp2"):
            for ckpt in (False, True):
                cells = []
                for n in (1, 2, 4, 8):
                    if sharding == "fsdp2" and n == 1:
                        cells.append(f"{'-':>16}")
                        continue
                    dph, grpo = (
                        learner_bytes(counts, acts, arch["hidden_size"], arch["num_hidden_layers"], sharding=sharding,
                                      n=n, tokens=args.tokens, checkpointing=ckpt, reference=ref) / GB
                        for ref in (False, True)
                    )
                    cells.append(f"{dph:>7.1f} / {grpo:<6.1f}")
                    for method, value in (("DPH", dph), ("GRPO+KL", grpo)):
                        if value <= GPU_GB and (name, method) not in smallest:
                            smallest[(name, method)] = f"{n} x {GPU_GB} GB ({sharding}, checkpointing {'on' if ckpt else 'off'})"
                print(f"{name:<14}{counts['P'] / 1e9:>7.2f}B  {sharding:<7}{'on' if ckpt else 'off':<5}" + "".join(cells))
        print(f"{'':<14}a_layer {acts['a_layer'] / 1e3:.1f} kB/token/layer, a_head {acts['a_head'] / 1e3:.1f} kB/response token")
    print(f"\nSmallest setup per model with every learner within {GPU_GB} GB (first hit in the order DDP, FSDP2; N = 1, 2, 4, 8):")
    for (name, method), where in smallest.items():
        print(f"  {name:<14}{method:<9}{where}")


def measured_check(args) -> None:
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rllib_dph import columns as C
    from rllib_dph.algorithms.grpo import GRPOConfig
    from rllib_dph.batch import shard_groups
    from rllib_dph.sharding import held_bytes

    print(f"\nMeasured on CPU, float32, 2 learners (gloo), one update of {args.rows} rows x (32 prompt + 32 response) tokens:")
    print(f"{'model':<7}{'sharding':<9}{'params MB':>20}{'grads MB':>20}{'Adam MB':>20}{'activations MB':>22}")
    print(f"{'':<16}" + "".join(f"{'measured/formula':>20}" for _ in range(3)) + f"{'measured/formula':>22}")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for name, arch in MEASURED.items():
        folder = Path(tempfile.mkdtemp(prefix=f"memory-{name}-"))
        torch.manual_seed(0)
        Qwen2ForCausalLM(Qwen2Config(**arch, max_position_embeddings=512)).save_pretrained(folder)
        counts = param_counts(hf_config("qwen2", arch))
        batch = _token_batch(args.rows, 32, 32, arch["vocab_size"])
        rows = args.rows
        batch.update({
            C.BEHAVIOR_LOGP: np.full((rows, 64), -5.0, dtype=np.float32) * batch[C.RESPONSE_MASK],
            C.ADVANTAGES: np.tile([1.0, -1.0], rows // 2).astype(np.float32),
            C.GROUP_IDS: np.repeat(np.arange(rows // 4), 4), C.ROW_TYPE: np.zeros(rows, dtype=np.int64),
            C.REWARDS: np.zeros(rows, dtype=np.float32),
        })
        model = Qwen2ForCausalLM.from_pretrained(folder)
        acts = activation_bytes(model, {k: batch[k][: rows // 2] for k in (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)}, torch.float32)
        measured_act = acts["layer"] + acts["outside"]
        per_token = per_token_activations("qwen2", arch, dtype=torch.float32)  # from a one-layer model
        for sharding in ("ddp", "fsdp2"):
            config = (
                GRPOConfig().environment("rllib_dph/SQL-v0").llm(model_name=str(folder), max_response_length=32)
                .training(group_size=4, prompts_per_step=rows // 4, lr=1e-4, grad_clip=1.0)
                .learners(num_learners=2, num_cpus_per_learner=0.5, sharding=sharding)
            )
            group = config.build_learner_group(env=None, spaces={DEFAULT_MODULE_ID: _spaces()})
            shards = shard_groups(batch, 2)
            group.update(batches=[MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(s)}, env_steps=len(s[C.INPUT_IDS])) for s in shards], num_minibatches=1)
            held = [r.get() for r in group.foreach_learner(held_bytes)][0]
            group.shutdown()
            n = 2 if sharding == "fsdp2" else 1
            formula = {"parameters": 4 * counts["P"] / n, "gradients": 4 * counts["P"] / n, "optimizer": 8 * counts["P"] / n}
            cells = "".join(f"{held[k] / 1e6:>10.1f} / {formula[k] / 1e6:<8.1f}" for k in ("parameters", "gradients", "optimizer"))
            predicted_act = (rows // 2) * 64 * arch["num_hidden_layers"] * per_token["a_layer"] + (rows // 2) * 32 * per_token["a_head"]
            print(f"{name:<7}{sharding:<9}{cells}{measured_act / 1e6:>11.1f} / {predicted_act / 1e6:<9.1f}")
    ray.shutdown()
    print("(activations: a forward pass of the full model on one learner's half of the rows, next to"
          " the formula with a_layer and a_head measured on a one-layer model of the same width)")


def _spaces():
    import gymnasium as gym

    return (gym.spaces.Text(1), gym.spaces.Text(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per micro-batch per learner")
    parser.add_argument("--rows", type=int, default=16, help="rows of the measured update (multiple of 8)")
    parser.add_argument("--skip-measured", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print_table(args)
    if not args.skip_measured:
        measured_check(args)


if __name__ == "__main__":
    main()
