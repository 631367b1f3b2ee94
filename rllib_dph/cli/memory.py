"""Peak memory of a run, estimated from its config before anything is loaded.

One estimator, used by the preflight of ``rllib train`` (``rllib_dph.cli.preflight.memory_problems``:
refuse a run that will not fit before Ray starts) and by ``bench/memory.py`` (the "What fits
where" table and the check against measured peak RSS, reported in ``docs/memory.md``).

Per learner process (bytes; P parameters, P_t of them trainable, N learners, T decoder tokens
and R response positions of the largest micro-batch, H hidden, I intermediate, V vocab,
L layers):

    runtime      the process itself (Python, torch, transformers, RLlib; measured on CPU)
    weights      4·(P + P_a)  (fp32 master weights, LoRA's adapters P_a included; FSDP2: /N
                 + its unsharded working set)
    gradients    4·P_t          (FSDP2: /N); P_t = P, or P_a with LoRA
    optimizer    8·P_t  (Adam m, v; FSDP2: /N)
    copies       2·(P_mm + P_a) bf16 weight copies under autocast (DDP, dtype="bfloat16")
    reference    4·P when π_ref is loaded (kl_coeff > 0, DPH divergence="js_definition");
                 0 with LoRA (π_ref is the policy's base with its adapters disabled)
    activations  T·L·a_layer  (saved for the backward pass, see :func:`layer_bytes_per_token`),
                 with checkpointing T·L·4·H + T·a_layer; GRPO groups that share a prompt run it
                 once (T = U·prompt + rows·response) and copy its K/V to every row
    logits       R·V·(4 saved + 12 transient + 2 if bf16): the vocab-sized logits upcast to
                 fp32 for the log-softmax, the entropy's softmax, and their gradients
    lora         T·Σ r·e over the adapted linears of the decoder layers (with checkpointing: of
                 one layer): the rank-r outputs of the adapters' A, saved for B's backward;
                 with ``dropout > 0`` also each adapted linear's dropped input and its mask

Per rollout engine: runtime + weights in the engine dtype + KV cache of the rows decoded at
once + the sampling logits; a vLLM engine on a GPU reserves ``gpu_memory_utilization`` of it.

LoRA (``GRPOConfig.llm(lora=...)``, ``rllib_dph.policy.lora``): P_a = Σ r·(in + out) over the linear
layers that ``target_modules`` selects by peft 0.21's rule (:func:`adapted_modules`); the frozen
base keeps its fp32 weights and its activations (the gradient still flows through every layer).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional

GB = 1e9
#: Bytes of a learner or engine process before its model: Python, torch, transformers, Ray and
#: RLlib imported, 0.56 GB RSS measured on CPU (0.58 GB once a tiny-random learner is built:
#: ``python bench/memory.py --rss tiny-random:4:16:16:2``, "built"; docs/memory.md). Not counted
#: on a GPU (tensors only there).
RUNTIME_BYTES_CPU = 0.56e9
#: Bytes of the processes of a run that hold no model, on this machine's RAM: the ``rllib train``
#: driver (Tune and the algorithms imported) and Ray's own processes (GCS, raylet, agents):
#: 0.91 GB RSS measured on CPU with ``ray.init(num_cpus=2)`` (``python bench/memory.py
#: --ray-overhead``; docs/memory.md). Ray's idle workers become the run's actors, counted there.
DRIVER_AND_RAY_BYTES = 0.92e9
#: The memory check's margin: a run fits when its estimated peak times (1 + margin) is within
#: the budget. A choice: it covers the fp32 learner estimate's error against the measured peak
#: RSS (within -6 % / +6 %, docs/memory.md) and what other processes take while the run starts,
#: not all of bf16's or gradient checkpointing's underestimate (docs/memory.md).
MEMORY_MARGIN = 0.10
#: Saved-activation bytes per decoder token per layer, as coefficients of (H, I):
#: counted from the tensors autograd keeps in a Qwen2/Llama decoder layer (transformers 5):
#: fp32: 3 norm tensors before attention and 3 before the MLP, q, k, v after RoPE (k, v
#: repeated to all heads), the attention output and its reshaped copy (11·H), and 4·I in the
#: SwiGLU MLP (gate, silu(gate), up, their product), 4 bytes each. Under bf16 autocast the
#: norms stay fp32 and the matmul inputs/outputs are bf16. Checked against autograd's own
#: count on tiny-sql-math in tests/test_memory.py.
LAYER_COEFFS = {"float32": (44, 16), "bfloat16": (30, 8)}
#: Bytes per response position per vocabulary entry: the fp32 logits saved for the
#: log-softmax (4), the entropy's softmax and the backward pass's logit gradients alive at
#: once (3 × 4), and the bf16 logits themselves under autocast (2). Checked as part of the
#: peak RSS of whole updates (docs/memory.md).
LOGIT_BYTES = {"float32": 16, "bfloat16": 18}
#: Bytes per parameter of a rollout engine's weights, by engine dtype.
WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a causal LM's config (Qwen2 / Llama style decoder).

    Attributes:
        params: P, unique parameters (tied embeddings once).
        layer_params: Parameters of one decoder layer.
        root_params: The rest (embeddings, final norm, untied LM head).
        matmul_params: Parameters of matrix multiplications (autocast makes bf16 copies).
        hidden, intermediate, layers, heads, kv_heads, head_dim, vocab: The config's sizes.
        modules: ``(name, in, out, kind)`` of every ``nn.Linear`` (kind ``"linear"``) and
            ``nn.Embedding`` (``"embedding"``, in = rows, out = width) of the model, full module
            names: what LoRA can adapt (:func:`adapted_modules`); ``"output"`` marks the LM head.
    """

    params: int
    layer_params: int
    root_params: int
    matmul_params: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    modules: tuple = ()

    @classmethod
    def from_config(cls, config) -> "ModelShape":
        """Counts the parameters of a HF causal-LM config on the meta device (nothing allocated)."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        text = config.get_text_config(decoder=True)
        total = sum(p.numel() for p in model.parameters())
        layer = sum(p.numel() for p in model.get_decoder().layers[0].parameters())
        embed = model.get_input_embeddings().weight.numel()
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        heads = text.num_attention_heads
        return cls(
            params=total,
            layer_params=layer,
            root_params=total - text.num_hidden_layers * layer,
            matmul_params=total - (0 if tied else embed),
            hidden=text.hidden_size,
            intermediate=text.intermediate_size,
            layers=text.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            vocab=text.vocab_size,
            modules=_adaptable_modules(model),
        )

    @property
    def kv_dim(self) -> int:
        """Width of one token's keys (or values) in one layer."""
        return self.kv_heads * self.head_dim


def _adaptable_modules(model) -> tuple:
    """``ModelShape.modules`` of a (meta-device) HF causal LM."""
    import torch

    output = model.get_output_embeddings()
    modules = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            kind = "output" if module is output else "linear"
            modules.append((name, module.in_features, module.out_features, kind))
        elif isinstance(module, torch.nn.Embedding):
            modules.append((name, module.num_embeddings, module.embedding_dim, "embedding"))
    return tuple(modules)


def adapted_modules(shape: ModelShape, lora: dict) -> list[tuple]:
    """The entries of ``shape.modules`` that LoRA settings adapt, by peft 0.21's rule:
    ``"all-linear"`` is every ``nn.Linear`` but the output embedding (the LM head); a list of
    names matches a module whose full name equals a name or ends with ``"." + name``
    (``peft.tuners.tuners_utils.check_target_module_exists``).

    Raises:
        ValueError: ``shape`` has no module list (built without :meth:`ModelShape.from_config`).
    """
    from rllib_dph.policy.lora import lora_settings

    if not shape.modules:
        raise ValueError("this ModelShape has no module list; build it with ModelShape.from_config(config).")
    targets = lora_settings(lora)["target_modules"]
    if targets == "all-linear":
        return [m for m in shape.modules if m[3] == "linear"]
    return [m for m in shape.modules if any(m[0] == t or m[0].endswith("." + t) for t in targets)]


def adapter_params(shape: ModelShape, lora: Optional[dict]) -> int:
    """P_a: parameters of LoRA's adapters, r·(in + out) per adapted module (A: r × in, B: out × r;
    for an embedding A: r × rows, B: width × r); 0 without LoRA."""
    if lora is None:
        return 0
    from rllib_dph.policy.lora import lora_settings

    r = lora_settings(lora)["r"]
    return sum(r * (fan_in + fan_out) for _, fan_in, fan_out, _ in adapted_modules(shape, lora))


def _decoder_adapters(shape: ModelShape, lora: Optional[dict]) -> list[tuple]:
    """The adapted modules inside the decoder layers (``...layers.<i>....``), all layers."""
    if lora is None:
        return []
    return [m for m in adapted_modules(shape, lora) if re.search(r"(^|\.)layers\.\d+\.", m[0])]


def _adapter_split(shape: ModelShape, lora: Optional[dict]) -> tuple[float, float]:
    """(adapter parameters of one decoder layer, on average over the layers; those outside them)."""
    if lora is None:
        return 0.0, 0.0
    from rllib_dph.policy.lora import lora_settings

    inside = lora_settings(lora)["r"] * sum(fan_in + fan_out for _, fan_in, fan_out, _ in _decoder_adapters(shape, lora))
    return inside / shape.layers, adapter_params(shape, lora) - inside


@dataclass(frozen=True)
class MicroBatch:
    """The largest forward pass of one learner: ``rows`` rows of ``prompt`` + ``response`` tokens.

    ``group_size`` rows share a prompt (a GRPO group); the learner then runs it once.
    """

    rows: int
    prompt: int
    response: int
    group_size: int = 1

    @property
    def tokens(self) -> int:
        """Padded tokens of the micro-batch, rows × (prompt + response)."""
        return self.rows * (self.prompt + self.response)

    @property
    def prompts(self) -> int:
        """Distinct prompts U = ⌈rows / group_size⌉."""
        return math.ceil(self.rows / max(1, self.group_size))

    def shares_prompts(self, setup: "LearnerSetup") -> bool:
        """Whether the learner runs each prompt once (``rl_module.shared_prompt_hidden``):
        not under checkpointing or FSDP2, and only when it saves token slots."""
        if setup.gradient_checkpointing or setup.sharding == "fsdp2" or self.prompt == 0:
            return False
        return self.prompts * self.prompt + self.rows * self.response < self.tokens

    def decoder_tokens(self, setup: "LearnerSetup") -> int:
        """Token slots the decoder runs: U·prompt + rows·response when prompts are shared."""
        if self.shares_prompts(setup):
            return self.prompts * self.prompt + self.rows * self.response
        return self.tokens


@dataclass(frozen=True)
class LearnerSetup:
    """How a learner holds and trains the model.

    Attributes:
        dtype: Compute dtype, ``"float32"`` or ``"bfloat16"`` (parameters stay fp32).
        sharding: ``"ddp"`` (a full replica per learner) or ``"fsdp2"`` (1/N shards).
        num_learners: N, learners the model is sharded over (FSDP2).
        gradient_checkpointing: Recompute each layer's activations in the backward pass.
        reference: Whether a term needs the frozen reference model π_ref; it is loaded (fp32)
            unless ``lora`` is set (then π_ref is the base with its adapters disabled).
        lora: None (full fine-tuning) or LoRA settings (``GRPOConfig.lora``): only the adapters
            get gradients and Adam state.
        device: ``"cpu"`` (the process's runtime is counted) or ``"cuda"`` (tensors only).
    """

    dtype: str = "float32"
    sharding: str = "ddp"
    num_learners: int = 1
    gradient_checkpointing: bool = False
    reference: bool = False
    lora: Optional[dict] = None
    device: str = "cpu"

    @property
    def loads_reference(self) -> bool:
        """Whether π_ref is a second model in memory (needed, and no LoRA base to serve as it)."""
        return self.reference and self.lora is None


@dataclass(frozen=True)
class Estimate:
    """Peak bytes of one process, by part (the parts add up to :attr:`total`)."""

    parts: dict = field(default_factory=dict)

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))

    def summary(self) -> str:
        """``"3.1 GB (weights 0.5, gradients 0.5, ...)"``: the total and every non-zero part in GB."""
        parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in self.parts.items() if v)
        return f"{self.total / GB:.2f} GB ({parts})"


def layer_bytes_per_token(shape: ModelShape, dtype: str) -> float:
    """a_layer: bytes one decoder layer saves for the backward pass per token (``LAYER_COEFFS``)."""
    c_h, c_i = LAYER_COEFFS[dtype]
    return c_h * shape.hidden + c_i * shape.intermediate


def lora_layer_bytes_per_token(shape: ModelShape, setup: LearnerSetup) -> float:
    """What LoRA adds to a decoder layer's saved activations per token (on average over the
    layers): each adapted linear's rank-r output of A (saved for B's weight gradient), r·e bytes;
    with ``dropout > 0`` also its dropped input (saved for A's, in·e) and the dropout mask (in
    bytes). e = 4 (fp32) or 2 (bf16). The rest of the layer is counted as without LoRA
    (:data:`LAYER_COEFFS`), an upper bound: frozen layers that are not adapted save less."""
    if setup.lora is None:
        return 0.0
    from rllib_dph.policy.lora import lora_settings

    settings = lora_settings(setup.lora)
    elem = 4 if setup.dtype == "float32" else 2
    dropped = settings["dropout"] > 0
    return sum(settings["r"] * elem + (fan_in * (elem + 1) if dropped else 0)
               for _, fan_in, _, _ in _decoder_adapters(shape, setup.lora)) / shape.layers


def activation_bytes(shape: ModelShape, batch: MicroBatch, setup: LearnerSetup) -> float:
    """Saved activations of the decoder for one micro-batch (no logits; see module doc).

    With shared prompts each row also holds its prompt's keys and values (copied from the
    prompt pass) and the response pass's attention saves keys and values over prompt + response
    repeated to all heads: rows·(prompt·2·kv_dim + (prompt + response)·2·H) per layer. On a
    CPU that masked attention runs PyTorch's math kernel, which also saves its scores and
    probabilities: rows·2·heads·response·(prompt + response) per layer.
    """
    a_layer = layer_bytes_per_token(shape, setup.dtype) + lora_layer_bytes_per_token(shape, setup)
    tokens = batch.decoder_tokens(setup)
    if setup.gradient_checkpointing:
        return tokens * shape.layers * 4 * shape.hidden + tokens * a_layer
    act = tokens * shape.layers * a_layer
    if batch.shares_prompts(setup):
        elem = 4 if setup.dtype == "float32" else 2
        keys = batch.prompt + batch.response
        per_row = batch.prompt * 2 * shape.kv_dim + keys * 2 * shape.hidden
        if setup.device == "cpu":  # CPU attention with a mask saves its scores and probabilities
            per_row += 2 * shape.heads * batch.response * keys
        act += batch.rows * per_row * elem * shape.layers
    return act


def state_bytes(shape: ModelShape, setup: LearnerSetup) -> dict:
    """Weights, gradients, Adam state, autocast copies / FSDP2 working set and π_ref, in bytes.

    FSDP2 (one unit per decoder layer, the rest as the root): each learner holds 1/N of the fp32
    weights, gradients and Adam state, plus the gathered compute-dtype copies of the current and
    the prefetched layer and of the root, and one unit's fp32 gradients before reduce-scatter.
    With LoRA the adapters (P_a) are the only trainable parameters; the frozen base weights keep
    their fp32 copy and, under autocast, their bf16 copies (saved for the input gradients).
    """
    adapters = adapter_params(shape, setup.lora)
    P, trainable = shape.params + adapters, shape.params if setup.lora is None else adapters
    half = 2 if setup.dtype == "bfloat16" else 4
    if setup.sharding == "fsdp2":
        n = max(1, setup.num_learners)
        layer_adapters, root_adapters = _adapter_split(shape, setup.lora)
        layer, root = shape.layer_params + layer_adapters, shape.root_params + root_adapters
        gathered = 2 * half * layer + half * root
        unit_gradients = max(layer, root) if setup.lora is None else max(layer_adapters, root_adapters)
        return {
            "weights": 4 * P / n,
            "gradients": 4 * trainable / n,
            "optimizer": 8 * trainable / n,
            "copies": gathered + 4 * unit_gradients,
            "reference": (4 * shape.params / n + gathered) if setup.loads_reference else 0,
        }
    return {
        "weights": 4 * P,
        "gradients": 4 * trainable,
        "optimizer": 8 * trainable,
        "copies": 2 * (shape.matmul_params + adapters) if setup.dtype == "bfloat16" else 0,
        "reference": 4 * shape.params if setup.loads_reference else 0,
    }


def learner_estimate(shape: ModelShape, batch: MicroBatch, setup: LearnerSetup) -> Estimate:
    """Peak bytes of one learner process during an update (see the module docstring)."""
    parts = {"runtime": RUNTIME_BYTES_CPU if setup.device == "cpu" else 0}
    parts.update(state_bytes(shape, setup))
    parts["activations"] = activation_bytes(shape, batch, setup)
    parts["logits"] = batch.rows * batch.response * shape.vocab * LOGIT_BYTES[setup.dtype]
    return Estimate(parts)


def engine_estimate(
    shape: ModelShape, *, rows: int, prompt: int, response: int, dtype: str, device: str = "cpu"
) -> Estimate:
    """Peak bytes of an HF rollout engine decoding ``rows`` rows of ``prompt`` + ``response``.

    Weights in ``dtype``, the KV cache (2·kv_dim per token per layer) and three (rows, V) fp32
    tensors of the sampling step (logits, probabilities, their log).
    """
    elem = WEIGHT_BYTES[dtype]
    return Estimate({
        "runtime": RUNTIME_BYTES_CPU if device == "cpu" else 0,
        "weights": elem * shape.params,
        "kv_cache": rows * (prompt + response) * shape.layers * 2 * shape.kv_dim * elem,
        "logits": 3 * rows * shape.vocab * 4,
    })


# ---------------------------------------------------------------------- a run's processes
#: Prompts read to find the longest (the env's first ones).
PROMPT_SAMPLE = 256


@dataclass(frozen=True)
class Process:
    """One process of a run and its estimated peak: where it runs and what share of a GPU."""

    name: str
    estimate: Estimate
    device: str = "cpu"
    gpu_fraction: float = 0.0


def learner_setup(config, device: str) -> LearnerSetup:
    """The :class:`LearnerSetup` of a GRPO-family config on ``device``."""
    return LearnerSetup(
        dtype=config.dtype,
        sharding=config.sharding,
        num_learners=max(1, config.num_learners),
        gradient_checkpointing=bool(config.gradient_checkpointing),
        reference=bool(getattr(config, "needs_reference_model", False)),
        lora=config.lora,
        device=device,
    )


def learner_microbatch(config, prompt: int) -> MicroBatch:
    """The largest micro-batch one learner runs: the step's rows (plus DPH's D_pef share) split
    into mini-batches (``minibatch_size``) and over the learners, then cut to
    ``max_tokens_per_microbatch`` padded tokens; every row counted at its longest."""
    from rllib_dph.learners.splits import num_minibatches

    rows = config.prompts_per_step * config.group_size
    pef_ratio = getattr(config, "pef_ratio", None)
    pef = math.ceil(rows / pef_ratio) if pef_ratio else 0
    per_step = math.ceil((rows + pef) / num_minibatches(rows, config.minibatch_size))
    per_learner = math.ceil(per_step / max(1, config.num_learners))
    length = prompt + config.max_response_length
    if config.max_tokens_per_microbatch:
        per_learner = min(per_learner, max(1, config.max_tokens_per_microbatch // length))
    return MicroBatch(per_learner, prompt, config.max_response_length, config.group_size)


def engine_process(config, shape: ModelShape, prompt: int, name: str, gpu_total: float) -> Process:
    """A rollout engine: its weights, KV cache and sampling logits, or, for an engine that
    reserves a share of its GPU at start (``EngineSpec.gpu_memory_share``, vLLM), that share
    (``engine_kwargs["gpu_memory_utilization"]`` if given) of the GPU's ``gpu_total`` bytes."""
    from rllib_dph.engines import ENGINES

    device = "cuda" if config.num_gpus_per_env_runner > 0 else "cpu"
    kwargs = dict(config.engine_kwargs)
    share = ENGINES[config.engine].gpu_memory_share
    if share is not None and device == "cuda":
        reserved = kwargs.get("gpu_memory_utilization", share) * gpu_total
        return Process(name, Estimate({"reserved": reserved}), device, config.num_gpus_per_env_runner)
    runners = max(1, config.num_env_runners)
    rows = math.ceil(config.prompts_per_step / runners) * config.group_size
    rows = min(rows, kwargs.get("max_batch_size", _default_engine_argument(config.engine, "max_batch_size", rows)))
    dtype = kwargs.get("dtype", config.dtype)
    estimate = engine_estimate(shape, rows=rows, prompt=prompt, response=config.max_response_length,
                               dtype=dtype if dtype in WEIGHT_BYTES else "float32", device=device)
    return Process(name, estimate, device, config.num_gpus_per_env_runner)


def _default_engine_argument(engine: str, name: str, fallback):
    """The default of the engine class's ``__init__`` argument ``name`` (e.g. the HF engine's
    ``max_batch_size``), or ``fallback`` when it has none."""
    import inspect

    from rllib_dph.engines import engine_class

    parameter = inspect.signature(engine_class(engine).__init__).parameters.get(name)
    return fallback if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def run_processes(config, shape: ModelShape, prompt: int, gpu_total: float = 0.0) -> list[Process]:
    """Every process of a run that holds the model: the algorithm process (its local env
    runner's engine, and the learner when ``num_learners=0``), the learners, the env runners."""
    device = "cuda" if config.num_gpus_per_learner > 0 else "cpu"
    learner = learner_estimate(shape, learner_microbatch(config, prompt), learner_setup(config, device))
    local_engine = engine_process(config, shape, prompt, "algorithm (local env runner)", gpu_total)
    processes = []
    if config.num_learners == 0 and device == local_engine.device:
        # One process: the runtime once, the learner's and the engine's tensors added up.
        parts = {**learner.parts, **{f"engine {k}": v for k, v in local_engine.estimate.parts.items() if k != "runtime"}}
        processes.append(Process("algorithm (learner and local env runner)", Estimate(parts), device,
                                 config.num_gpus_per_learner))
    else:
        processes.append(local_engine)
        learners = max(1, config.num_learners)
        processes += [Process(f"learner {i + 1} of {learners}", learner, device, config.num_gpus_per_learner)
                      for i in range(learners)]
    processes += [engine_process(config, shape, prompt, f"env runner {i + 1}", gpu_total)
                  for i in range(config.num_env_runners)]
    return processes


# ---------------------------------------------------------------------- the device's budget
@dataclass(frozen=True)
class Budget:
    """Memory a run may use: available RAM of this machine and free memory of each GPU."""

    ram: float
    gpu_free: tuple = ()
    gpu_total: float = 0.0


def available_ram(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> float:
    """RAM that new processes can take, in bytes: ``MemAvailable`` of this machine, or less when
    this process's control group (a container) has a memory limit: the limit less the group's
    usage (cgroup v2 ``memory.max`` and ``memory.current``; v1 ``memory/memory.limit_in_bytes``
    and ``memory/memory.usage_in_bytes``). A limit of ``max`` (v2) or one above the machine's
    RAM (v1's "unlimited") is no limit."""
    with open(meminfo) as f:
        fields = {line.split(":")[0]: float(line.split()[1]) * 1024 for line in f if ":" in line and len(line.split()) > 1}
    if "MemAvailable" not in fields:
        raise RuntimeError(f"{meminfo} has no MemAvailable line")
    available = fields["MemAvailable"]
    limit = cgroup_limit(cgroup)
    if limit is not None and limit[0] < fields.get("MemTotal", float("inf")):
        available = min(available, max(0.0, limit[0] - limit[1]))
    return available


def cgroup_limit(cgroup: str = "/sys/fs/cgroup") -> Optional[tuple[float, float]]:
    """(memory limit, memory usage) in bytes of the control group mounted at ``cgroup`` (v2, else
    v1), or None without a limit (``max``) or without the files."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            with open(os.path.join(cgroup, limit_file)) as f:
                limit = f.read().strip()
            with open(os.path.join(cgroup, usage_file)) as f:
                usage = float(f.read().strip())
        except (OSError, ValueError):
            continue
        return None if limit == "max" else (float(limit), usage)
    return None


def gpu_memory() -> tuple[tuple, float]:
    """(free bytes of each visible GPU, total bytes of one) from ``torch.cuda.mem_get_info``.

    Asked in a short subprocess, so that the driver holds no CUDA context during the run.
    """
    import json
    import subprocess
    import sys

    code = ("import json, torch; n = torch.cuda.device_count(); "
            "print(json.dumps([torch.cuda.mem_get_info(i) for i in range(n)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    infos = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []
    return tuple(float(free) for free, _ in infos), max((float(total) for _, total in infos), default=0.0)


def device_budget(config) -> Budget:
    """The budget of a run: GPU memory is asked for only when the config uses GPUs."""
    uses_gpu = config.num_gpus_per_learner > 0 or config.num_gpus_per_env_runner > 0
    free, total = gpu_memory() if uses_gpu else ((), 0.0)
    return Budget(available_ram(), free, total)


@dataclass(frozen=True)
class Load:
    """Estimated demand on one device (this machine's RAM or one GPU) and its budget."""

    device: str
    demand: float
    budget: float
    processes: tuple

    @property
    def fits(self) -> bool:
        """The demand with its margin (:data:`MEMORY_MARGIN`) is within the budget."""
        return self.demand * (1 + MEMORY_MARGIN) <= self.budget


def device_loads(processes: list[Process], budget: Budget) -> list[Load]:
    """RAM: every CPU process of the run adds up on this machine. GPUs: processes are placed
    first-fit by their GPU fraction (as Ray packs fractional GPUs); each GPU's sum is its load."""
    cpu = [p for p in processes if p.device == "cpu"]
    loads = [Load("RAM", sum(p.estimate.total for p in cpu), budget.ram, tuple(cpu))]
    gpus: list[list] = [[] for _ in budget.gpu_free] or [[]]
    for proc in (p for p in processes if p.device == "cuda"):
        used = [sum(q.gpu_fraction for q in g) for g in gpus]
        index = next((i for i, u in enumerate(used) if u + min(proc.gpu_fraction, 1.0) <= 1.0 + 1e-9), len(gpus) - 1)
        gpus[index].append(proc)
    for i, group in enumerate(gpus):
        if group:
            free = budget.gpu_free[i] if i < len(budget.gpu_free) else 0.0
            name = f"GPU {i}" if budget.gpu_free else "GPU (none visible on this machine)"
            loads.append(Load(name, sum(p.estimate.total for p in group), free, tuple(group)))
    return loads


# ---------------------------------------------------------------------- a config's verdict
def model_shape(name: str) -> ModelShape:
    """The :class:`ModelShape` of a model name (bundled, folder or HF id in the local cache), read
    without building it (``models.hub.architecture``: a bundled model not built yet from its spec
    or its base).

    Raises:
        FileNotFoundError: the model's config is not on this machine yet.
    """
    from rllib_dph.models.hub import architecture

    return ModelShape.from_config(architecture(name))


def planned_env_config(config) -> dict:
    """The env config the env runners of ``config`` will sample: its ``sampling_env_config`` (DPH:
    the D_exp file), or, while DPH's pre-sampling has yet to write D_exp (``rllib train`` checks
    before it pre-samples), the ``env_config`` that D_exp is drawn from, a superset of its prompts."""
    from rllib_dph.algorithms.dph.presample import PefFileError

    try:
        return getattr(config, "sampling_env_config", config.env_config)
    except PefFileError:  # prepare_pef writes it, or refuses a file it cannot use, before training
        return dict(config.env_config)


def longest_prompt(config) -> int:
    """Tokens of the longest of the env's first ``PROMPT_SAMPLE`` prompts (chat template applied),
    read as the env runners read them.

    Raises:
        FileNotFoundError: the model (its tokenizer) is not built or cached yet.
    """
    from rllib_dph.models.folders import load_tokenizer_folder
    from rllib_dph.models.hub import config_source
    from rllib_dph.envs import make_env
    from rllib_dph.rollout.episodes import encode_task

    tokenizer = load_tokenizer_folder(config_source(config.model_name))  # nothing is built here
    env = make_env(config.env, planned_env_config(config))
    try:
        return max(len(encode_task(tokenizer, task)) for task in env.tasks[:PROMPT_SAMPLE])
    finally:
        env.close()


@dataclass(frozen=True)
class MemoryCheck:
    """A config's processes, their loads on each device and, when one does not fit, fixes."""

    processes: list
    loads: list
    fixes: list

    @property
    def fits(self) -> bool:
        return all(load.fits for load in self.loads)

    @property
    def worst(self) -> Load:
        """The load closest to (or furthest over) its budget."""
        return max(self.loads, key=lambda load: load.demand / max(load.budget, 1.0))


def driver_and_ray() -> Process:
    """The processes of a run that hold no model: the driver and Ray's own (:data:`DRIVER_AND_RAY_BYTES`)."""
    return Process("driver and Ray's own processes", Estimate({"runtime": DRIVER_AND_RAY_BYTES}))


def config_loads(config, shape: ModelShape, prompt: int, budget: Budget) -> list[Load]:
    """The loads of ``config``'s processes, the driver's and Ray's included, on this machine's
    RAM and its GPUs."""
    return device_loads(run_processes(config, shape, prompt, budget.gpu_total) + [driver_and_ray()], budget)


def candidate_fixes(config, shape: ModelShape, prompt: int) -> list[tuple[str, dict]]:
    """Settings that lower the peak, cheapest first: smaller micro-batches (halving the current
    one's padded tokens down to one row), activation checkpointing, FSDP2 over 2, 4, 8 learners
    (only where learners have GPUs: on one CPU machine the learners add up), then LoRA with the
    default settings (``lora.LORA_DEFAULTS``) when the config is not LoRA already: last, because
    it changes what is trained (the others change only how)."""
    from rllib_dph.policy.lora import LORA_DEFAULTS

    length = prompt + config.max_response_length
    tokens = learner_microbatch(config, prompt).rows * length
    fixes = []
    while tokens > length:
        tokens = max(length, tokens // 2)
        fixes.append((f"max_tokens_per_microbatch={tokens}", {"max_tokens_per_microbatch": tokens}))
    if not config.gradient_checkpointing:
        fixes.append(("gradient_checkpointing=True", {"gradient_checkpointing": True}))
    if config.num_gpus_per_learner > 0:
        for n in (2, 4, 8):
            if n > config.num_learners or config.sharding != "fsdp2":
                fixes.append((f'sharding="fsdp2" over num_learners={n}', {"sharding": "fsdp2", "num_learners": n}))
    if config.lora is None:
        fixes.append((f"LoRA, lora={LORA_DEFAULTS}", {"lora": dict(LORA_DEFAULTS)}))
    return fixes


def check_config(config, shape: ModelShape, prompt: int, budget: Budget) -> MemoryCheck:
    """Estimates every process of ``config`` against ``budget``; when something does not fit,
    each candidate fix (alone) is re-estimated: the first micro-batch size that fits (or the
    smallest), and every other fix that lowers the worst load, with its worst load."""
    loads = config_loads(config, shape, prompt, budget)
    check = MemoryCheck(run_processes(config, shape, prompt, budget.gpu_total) + [driver_and_ray()], loads, [])
    if check.fits:
        return check
    fixes, token_fix = [], None
    for label, changes in candidate_fixes(config, shape, prompt):
        variant = config.copy(copy_frozen=False)
        for key, value in changes.items():
            setattr(variant, key, value)
        worst = MemoryCheck([], config_loads(variant, shape, prompt, budget), []).worst
        if "max_tokens_per_microbatch" in changes:
            if token_fix is None or not token_fix[1].fits:
                token_fix = (label, worst)
        elif worst.demand / max(worst.budget, 1.0) < check.worst.demand / max(check.worst.budget, 1.0):
            fixes.append((label, worst))
    return MemoryCheck(check.processes, loads, ([token_fix] if token_fix else []) + fixes)


def _gb(value: float) -> str:
    return f"{value / GB:.1f} GB"


def _load_text(load: Load) -> str:
    """``"RAM: 9.5 GB of 8.0 GB (learner 1 of 1: 9.50 GB (weights ...))"``."""
    procs = "; ".join(f"{p.name}: {p.estimate.summary()}" for p in load.processes)
    return f"{load.device}: {_gb(load.demand)} of {_gb(load.budget)} ({procs})"


def fit_line(check: MemoryCheck) -> str:
    """The one line printed for a run that fits: each device's estimate and budget."""
    loads = ", ".join(f"{load.device} {_gb(load.demand)} of {_gb(load.budget)}" for load in check.loads if load.processes)
    return f"rllib: memory estimate (peak, per device): {loads} available; fits."


def refusal_message(check: MemoryCheck) -> str:
    """Why a run will not fit (the estimate, the budget, per process) and the cheapest fixes,
    each with its estimated effect."""
    over = [load for load in check.loads if not load.fits]
    lines = [f"the estimated peak memory exceeds the budget on {', '.join(load.device for load in over)} "
             f"(with a {MEMORY_MARGIN:.0%} margin):"]
    lines += [f"    {_load_text(load)}" for load in over]
    lines.append("    Cheapest fixes, each alone (estimated peak on the fullest device):")
    for label, worst in check.fixes:
        verdict = "fits" if worst.fits else "still over"
        lines.append(f"      - {label}: {worst.device} {_gb(worst.demand)} of {_gb(worst.budget)} ({verdict})")
    lines.append("    Pass --force to start anyway.")
    return "\n".join(lines)
