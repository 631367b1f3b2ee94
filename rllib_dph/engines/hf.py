"""Rollout engine on Hugging Face ``transformers``: batched sampling with a KV cache (CPU or GPU).

The sampling loop is our own rather than ``model.generate`` so that it reports, for every sampled
token, its log-prob μ under the policy's tempered distribution softmax(logits / T) over the full
vocabulary (in fp32) and the top-K of that same distribution, whatever top-p filter chose the
token (see ``engines.base.SamplingParams``). All rows of a chunk advance together; per token
there is no Python work over rows.

Two decode paths share the prefill and the sampling (:func:`sample_next`):

- eager (the default): a KV cache that grows in place (:class:`PreallocatedLayer`), and
  finished rows leave the batch, so late steps compute only the rows still running;
- compiled (``compile_decode=True``, :class:`CompiledDecoder`, meant for GPUs): every step the
  same shapes on the same buffers (a static KV cache, rows and length padded to buckets), run
  through ``torch.compile`` — on CUDA with ``mode="reduce-overhead"``, i.e. recorded once as a
  CUDA graph and replayed, which removes the per-step Python and kernel-launch cost that bounds
  small models on a GPU.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer, StaticCache

from rllib_dph.engines.base import Completion, SamplingParams, check_generate_args
from rllib_dph.policy.lora import add_adapters, has_adapters, is_lora_state, load_into
from rllib_dph.models.folders import load_model_folder, load_tokenizer_folder
from rllib_dph.models.transformers_api import cache_kwargs

# Stopped rows leave the batch (a copy of the KV cache) once they are this share of it.
COMPACT_FRACTION = 0.25
#: The compiled decoder pads a chunk's rows and its prompt + response length up to multiples of
#: these, so that a few shapes (each compiled, and on CUDA graph-captured, once) serve all chunks.
ROW_BUCKET = 16
LENGTH_BUCKET = 128


class HFEngine:
    """Generates groups of completions with a ``transformers`` causal LM.

    All ``len(prompts) * n`` rows are left-padded and decoded together in chunks of at most
    ``max_batch_size`` rows; each distinct prompt of a chunk is prefilled once and its KV cache
    repeated for its ``n`` rows. A row stops at a stop token (kept in the output) or after
    ``max_new_tokens``; stopped rows leave the batch once they are a quarter of it. Models with
    full attention in every layer (Qwen2, Llama, ...) are supported.

    Args:
        model: A causal LM (e.g. ``Qwen2ForCausalLM``); it is moved to ``device`` and put in eval mode.
        tokenizer: Its Hugging Face tokenizer; ``tokenizer.eos_token_id`` stops a completion.
        device: Where to run (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        max_batch_size: Most rows decoded at once, >= 1 (bounds the KV-cache memory).
        stop_token_ids: Extra token ids that end a completion, besides the tokenizer's EOS and
            the model's ``generation_config.eos_token_id`` (e.g. a chat end-of-turn token).
        compile_decode: Decode through :class:`CompiledDecoder` (static KV cache,
            ``torch.compile``; CUDA graphs on a GPU). Off by default (its measured speed-ups:
            docs/engines.md, "Compiled decoding for GPUs"); on CPU the eager path, which drops
            finished rows, is faster. The first chunk of each (rows, length) bucket pays the
            compilation.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        device: str | torch.device = "cpu",
        max_batch_size: int = 256,
        stop_token_ids: Sequence[int] = (),
        compile_decode: bool = False,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1; pass e.g. 256.")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        text_config = model.config.get_text_config(decoder=True)
        layer_types = set(getattr(text_config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ValueError(
                f"model has layer types {sorted(layer_types)}; HFEngine's KV cache supports only "
                "full attention in every layer. Disable sliding-window attention in the model "
                "config (e.g. use_sliding_window=False) or use the vLLM engine."
            )
        self.num_layers = text_config.num_hidden_layers
        stop_ids = set(stop_token_ids)
        generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for eos in (tokenizer.eos_token_id, generation_eos):
            if eos is not None:
                stop_ids.update([eos] if isinstance(eos, int) else eos)
        self.stop_token_ids = torch.tensor(sorted(stop_ids), dtype=torch.long, device=self.device)
        self.compiled = CompiledDecoder(self.model, max_rows=max_batch_size) if compile_decode else None

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, dtype=None, device: str | torch.device = "cpu",
        lora: Optional[Mapping[str, Any]] = None, **kwargs,
    ) -> "HFEngine":
        """Loads a model folder (or HF id) and its tokenizer; ``engines.make_engine`` takes names.

        Args:
            name_or_path: A ``save_pretrained`` folder or a Hugging Face id.
            dtype: Weight dtype (e.g. ``"bfloat16"``); None keeps the checkpoint's.
            device: Where to run.
            lora: The LoRA settings of the policy whose adapters ``update_weights`` will get
                (``GRPOConfig.lora``): the adapters are added now, with B = 0 (the base policy
                until the first sync).
            **kwargs: Passed to :class:`HFEngine` (``max_batch_size``, ``stop_token_ids``,
                ``compile_decode``).
        """
        model = load_model_folder(name_or_path, dtype=dtype, device=device)
        if lora is not None:
            add_adapters(model, lora).requires_grad_(False)
        return cls(model, load_tokenizer_folder(name_or_path), device=device, **kwargs)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """Samples ``params.n`` completions for each prompt.

        Args:
            prompts: Token ids of each prompt, no padding, at least one token each.
            params: How to sample; the same ``seed``, prompts, weights and ``max_batch_size``
                give the same completions.

        Returns:
            One list of ``params.n`` completions per prompt, in prompt order.
        """
        check_generate_args(prompts, params)
        generator = torch.Generator(device=self.device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)

        rows = [i for i in range(len(prompts)) for _ in range(params.n)]  # prompt of each row
        completions = []
        with torch.inference_mode():
            for start in range(0, len(rows), self.max_batch_size):
                chunk = rows[start : start + self.max_batch_size]
                counts = Counter(chunk)  # rows per prompt, in prompt order
                completions += self._generate_rows(
                    [prompts[i] for i in counts], list(counts.values()), params, generator
                )
        return [completions[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _generate_rows(
        self,
        prompts: list[Sequence[int]],
        counts: list[int],
        params: SamplingParams,
        generator: torch.Generator,
    ) -> list[Completion]:
        """Decodes one chunk: ``counts[u]`` adjacent rows for each prompt ``prompts[u]``.

        Each prompt is prefilled once and its KV cache repeated for its rows.
        """
        prompt_of_row = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(counts))
        prompt_of_row = prompt_of_row.to(self.device)  # (B,)
        cache, logits, attention_mask, next_position = self._prefill(prompts, prompt_of_row, params.max_new_tokens)
        decode = self._decode if self.compiled is None else self.compiled.decode
        outputs = decode(cache, logits, attention_mask, next_position, params, generator, self.stop_token_ids)
        return _completions(*outputs, with_topk=params.top_k_logprobs > 0)

    def _prefill(self, prompts: list[Sequence[int]], prompt_of_row: torch.Tensor, T: int):
        """Runs the left-padded prompts through the model once and repeats their KV cache per row.

        Args:
            prompts: Token ids of the U distinct prompts of the chunk.
            prompt_of_row: (B,) index into ``prompts`` of each row.
            T: Most new tokens (the cache and mask have room for them).

        Returns:
            The KV cache (B rows), the (B, V) next-token logits, the (B, P + T) attention mask
            (prompt part set) and the (B,) position of the next token.
        """
        device = self.device
        # Left padding: the pad id (0) is never attended to.
        P = max(len(p) for p in prompts)
        input_ids = torch.zeros(len(prompts), P, dtype=torch.long)  # (U, P)
        attention_mask = torch.zeros(len(prompts), P + T, dtype=torch.long)  # (U, P + T)
        for u, prompt in enumerate(prompts):
            input_ids[u, P - len(prompt) :] = torch.as_tensor(prompt)
            attention_mask[u, P - len(prompt) : P] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = (attention_mask[:, :P].cumsum(-1) - 1).clamp(min=0)  # (U, P)
        cache = Cache(layers=[PreallocatedLayer(P + T) for _ in range(self.num_layers)])
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask[:, :P],
            position_ids=position_ids,
            **cache_kwargs(self.model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_select_indices(prompt_of_row)
        logits = out.logits[prompt_of_row, -1]  # (B, V)
        attention_mask = attention_mask[prompt_of_row]  # (B, P + T)
        next_position = position_ids[prompt_of_row, -1] + 1  # (B,)
        return cache, logits, attention_mask, next_position

    def _decode(self, cache, logits, attention_mask, next_position, params: SamplingParams, generator, stop_ids):
        """Samples up to ``params.max_new_tokens`` tokens for every row after :meth:`_prefill`.

        Returns:
            (B, T) tokens, (B, T) μ log-probs, (B, T, K) top-K ids and log-probs, (B,) lengths
            and (B,) stopped flags (a stop token was drawn).
        """
        T = params.max_new_tokens
        P = attention_mask.shape[1] - T
        out = DecodeOutputs(len(next_position), params, self.device)
        active = torch.arange(len(next_position), device=self.device)  # chunk row of each batch row

        for t in range(T):
            # Stopped rows still in the batch keep decoding; their extra tokens are cut off below.
            token = out.record(active, t, sample_next(logits, params, generator), stop_ids)
            done = out.stopped[active]  # (b,)
            num_done = int(done.sum())
            if t == T - 1 or num_done == len(active):
                break
            if num_done >= COMPACT_FRACTION * len(active):  # drop stopped rows and their cache
                keep = (~done).nonzero().squeeze(1)  # (b',)
                cache.batch_select_indices(keep)
                active, token = active[keep], token[keep]
                attention_mask, next_position = attention_mask[keep], next_position[keep]
            attention_mask[:, P + t] = 1
            step = self.model(
                input_ids=token[:, None],  # (b, 1)
                attention_mask=attention_mask[:, : P + t + 1],
                position_ids=next_position[:, None],
                **cache_kwargs(self.model, cache),
                use_cache=True,
            )
            logits = step.logits[:, -1]  # (b, V)
            next_position = next_position + 1
        return out.tensors()

    def update_weights(self, state_dict: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Loads a full state dict (tied weights included) into the model, keeping its dtype and device.

        A LoRA policy's state (``rllib_dph.policy.lora.adapter_state``: adapter tensors and settings)
        adds the same adapters to this engine's base model on first use and then loads only
        the adapter tensors; generation runs the unmerged adapters, so μ is the adapted policy's
        own distribution (``docs/lora.md``: why not merge-and-load).

        Args:
            state_dict: Parameter name → torch tensor or numpy array, as ``model.state_dict()``,
                or a LoRA adapter state.
        """
        if is_lora_state(state_dict):
            first = not has_adapters(self.model)
            load_into(self.model, state_dict)  # in place: a compiled graph stays valid after the first
            if first and self.compiled is not None:
                self.compiled = CompiledDecoder(self.model, max_rows=self.max_batch_size)
            return
        tensors = {name: torch.as_tensor(value) for name, value in state_dict.items()}
        with torch.no_grad():
            self.model.load_state_dict(tensors)


class DecodeOutputs:
    """The per-row outputs of one chunk's decoding, filled step by step.

    Args:
        B: Rows of the chunk.
        params: The sampling parameters (``max_new_tokens`` T, ``top_k_logprobs`` K).
        device: Where the buffers live.
    """

    def __init__(self, B: int, params: SamplingParams, device: torch.device):
        T, K = params.max_new_tokens, params.top_k_logprobs
        self.tokens = torch.zeros(B, T, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(B, T, dtype=torch.float32, device=device)
        self.topk_ids = torch.zeros(B, T, K, dtype=torch.long, device=device)
        self.topk_logprobs = torch.zeros(B, T, K, dtype=torch.float32, device=device)
        self.lengths = torch.full((B,), T, dtype=torch.long, device=device)
        self.stopped = torch.zeros(B, dtype=torch.bool, device=device)

    def record(self, rows: torch.Tensor, t: int, sampled: tuple, stop_ids: torch.Tensor) -> torch.Tensor:
        """Stores step ``t``'s :func:`sample_next` output for chunk rows ``rows``; returns the tokens.

        A row that draws a stop token for the first time gets its length (``t + 1``) and its
        stopped flag; later tokens of a stopped row are stored but cut off by its length.
        """
        token, token_logp, step_topk_ids, step_topk_logp = sampled
        self.tokens[rows, t] = token
        self.logprobs[rows, t] = token_logp
        if step_topk_ids is not None:
            self.topk_ids[rows, t] = step_topk_ids
            self.topk_logprobs[rows, t] = step_topk_logp
        new_stop = torch.isin(token, stop_ids) & ~self.stopped[rows]  # (b,)
        self.lengths[rows[new_stop]] = t + 1
        self.stopped[rows[new_stop]] = True
        return token

    def tensors(self) -> tuple:
        """(B, T) tokens, (B, T) μ, (B, T, K) top-K ids and log-probs, (B,) lengths and stopped flags."""
        return self.tokens, self.logprobs, self.topk_ids, self.topk_logprobs, self.lengths, self.stopped


class CompiledDecoder:
    """Decoding with a static KV cache through ``torch.compile`` (CUDA graphs on a GPU).

    A decoding step of a small model on a GPU costs Python and kernel launches, not arithmetic
    (docs/results/gpu.md, "Rollouts: eager and compiled decoding"). Here every step of a chunk
    is the same computation on the same buffers, so ``torch.compile(mode="reduce-overhead")``
    records it once as a CUDA graph and then replays it:

    - a ``transformers`` :class:`~transformers.cache_utils.StaticCache` (fixed (rows, heads,
      length, dim) buffers at fixed addresses, written in place at a position that is a device
      tensor), filled from the eager prefill;
    - a full-length (rows, length) attention mask, updated in place (positions not yet written
      are masked);
    - finished rows stay in the batch (their extra tokens are cut off by their length);
    - rows and prompt + response length padded up to multiples of :data:`ROW_BUCKET` (at most
      ``max_rows``) and :data:`LENGTH_BUCKET`; each (rows, length) bucket keeps its cache and
      its compiled graph (``dynamic=False``: one graph per bucket). Padding rows attend to
      position 0 only (finite values: zeros, or an earlier chunk's); their logits are unused.

    Sampling (:func:`sample_next`) runs outside the compiled step on the real rows' logits, as on
    the eager path, so μ is exactly the tempered softmax's log-prob of the sampled token. With the
    same seed the two paths draw the same tokens until the eager path first drops finished rows
    (it then draws fewer random numbers per step).

    Args:
        model: The engine's causal LM.
        max_rows: Most rows of a chunk (the engine's ``max_batch_size``): no bucket pads past it.
        mode: ``torch.compile`` mode; None: ``"reduce-overhead"`` (CUDA graphs) on CUDA, the
            default mode elsewhere.
    """

    def __init__(self, model, *, max_rows: int, mode: str | None = None):
        self.model = model
        self.max_rows = max_rows
        device = next(model.parameters()).device
        mode = mode or ("reduce-overhead" if device.type == "cuda" else "default")
        self.step = torch.compile(self._forward, mode=mode, fullgraph=True, dynamic=False)
        self.caches: dict[tuple[int, int], StaticCache] = {}

    def _forward(self, cache: StaticCache, token: torch.Tensor, position: torch.Tensor, mask: torch.Tensor):
        """One decoding step: (R, 1) tokens at (R, 1) positions, (R, C) mask -> (R, V) logits."""
        out = self.model(input_ids=token, attention_mask=mask, position_ids=position,
                         **cache_kwargs(self.model, cache), use_cache=True)
        return out.logits[:, -1]

    def bucket(self, rows: int, length: int) -> tuple[int, int]:
        """The (rows, positions) bucket of a chunk of ``rows`` rows and ``length`` positions."""
        return min(_round_up(rows, ROW_BUCKET), max(rows, self.max_rows)), _round_up(length, LENGTH_BUCKET)

    def static_cache(self, prefill: Cache, R: int, C: int) -> StaticCache:
        """Bucket (R rows, C positions)'s cache, holding ``prefill``'s B <= R rows of P positions.

        Positions past P keep stale values of an earlier chunk; the mask hides them until a
        step writes them.
        """
        first = prefill.layers[0]
        if (R, C) not in self.caches:
            cache = StaticCache(config=self.model.config, max_cache_len=C)
            _, H, _, D = first.keys.shape
            cache.early_initialization(R, H, D, first.keys.dtype, first.keys.device)
            self.caches[R, C] = cache
        cache = self.caches[R, C]
        B, P = first.keys.shape[0], first.keys.shape[2]
        for layer, filled in zip(cache.layers, prefill.layers):
            layer.keys[:B, :, :P] = filled.keys
            layer.values[:B, :, :P] = filled.values
            layer.cumulative_length.fill_(P)
        return cache

    def decode(self, prefill, logits, attention_mask, next_position, params: SamplingParams, generator, stop_ids):
        """:meth:`HFEngine._decode`'s contract on the static cache; same arguments, same outputs."""
        T = params.max_new_tokens
        B, P = len(next_position), attention_mask.shape[1] - T
        R, C = self.bucket(B, P + T)
        cache = self.static_cache(prefill, R, C)
        device = next_position.device
        mask = torch.zeros(R, C, dtype=attention_mask.dtype, device=device)  # (R, C)
        mask[:B, :P] = attention_mask[:, :P]
        mask[B:, 0] = 1
        token_in = torch.zeros(R, 1, dtype=torch.long, device=device)  # (R, 1)
        position = torch.zeros(R, 1, dtype=torch.long, device=device)  # (R, 1)
        position[:B, 0] = next_position
        out = DecodeOutputs(B, params, device)
        rows = torch.arange(B, device=device)

        for t in range(T):
            token = out.record(rows, t, sample_next(logits[:B], params, generator), stop_ids)
            if t == T - 1 or bool(out.stopped.all()):
                break
            mask[:B, P + t] = 1
            token_in[:B, 0] = token
            torch.compiler.cudagraph_mark_step_begin()  # the last step's logits are consumed
            logits = self.step(cache, token_in, position, mask)  # (R, V)
            position += 1
        return out.tensors()


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _completions(tokens, logprobs, topk_ids, topk_logprobs, lengths, stopped, *, with_topk: bool) -> list[Completion]:
    """The rows of :meth:`HFEngine._decode`'s tensors as completions cut at their lengths."""
    tokens, logprobs, lengths = tokens.cpu().numpy(), logprobs.cpu().numpy(), lengths.tolist()
    topk_ids, topk_logprobs = topk_ids.cpu().numpy(), topk_logprobs.cpu().numpy()
    return [
        Completion(
            token_ids=tokens[row, :length],
            logprobs=logprobs[row, :length],
            topk_ids=topk_ids[row, :length] if with_topk else None,
            topk_logprobs=topk_logprobs[row, :length] if with_topk else None,
            finish_reason="stop" if is_stopped else "length",
        )
        for row, (length, is_stopped) in enumerate(zip(lengths, stopped.tolist()))
    ]


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Samples one token per row and reports its μ log-prob and μ's top-K.

    The token is drawn from softmax(logits / temperature) restricted to the nucleus (the
    smallest set of most likely tokens with mass >= top_p) and renormalised. μ, the reported
    log-prob, is that of the full tempered softmax (the policy the learner differentiates; see
    ``engines.base.SamplingParams``), so before any update log π_θ = μ on every sampled token
    for every top_p. Temperature 0 makes μ a point mass on the argmax.

    Args:
        logits: (B, V) next-token logits, any float dtype (computed in fp32 here).
        params: Temperature, top-p and the number K of top log-probs (0 = none).
        generator: The random stream of this ``generate`` call.

    Returns:
        token (B,) int64, its log-prob (B,) fp32, and when K > 0 the top-K ids (B, K) int64 and
        log-probs (B, K) fp32 of μ, sorted descending, with the sampled token replacing the K-th
        entry when it is not among them; (None, None) when K = 0.
    """
    logits = logits.float()
    if params.temperature == 0:
        token = logits.argmax(-1)  # (B,)
        logp = torch.full_like(logits, -math.inf).scatter_(1, token[:, None], 0.0)  # (B, V)
    else:
        logp = torch.log_softmax(logits / params.temperature, dim=-1)  # (B, V), μ
        sampling_logp = logp
        if params.top_p < 1:
            sorted_logp, order = logp.sort(dim=-1, descending=True)  # (B, V)
            sorted_p = sorted_logp.exp()
            outside = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # mass before it already >= top_p
            outside = outside.scatter(1, order, outside)  # back to vocabulary order
            sampling_logp = torch.log_softmax(logp.masked_fill(outside, -math.inf), dim=-1)
        # Inverse-CDF sampling: one uniform draw per row (per-element noise costs far more on CPU).
        cdf = sampling_logp.exp().cumsum(-1)  # (B, V)
        u = torch.rand(len(cdf), 1, generator=generator, device=cdf.device) * cdf[:, -1:]  # (B, 1)
        token = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)
    token_logp = logp.gather(1, token[:, None]).squeeze(1)  # (B,)
    K = params.top_k_logprobs
    if K == 0:
        return token, token_logp, None, None
    topk_logp, topk_ids = logp.topk(K, dim=-1)  # (B, K)
    missing = (topk_ids != token[:, None]).all(-1)  # (B,)
    topk_ids[:, -1] = torch.where(missing, token, topk_ids[:, -1])
    topk_logp[:, -1] = torch.where(missing, token_logp, topk_logp[:, -1])
    return token, token_logp, topk_ids, topk_logp


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer with room for ``capacity`` positions, written in place.

    ``DynamicLayer`` concatenates the whole cache with the new position at every step; on CPU
    that fresh allocation dominates decoding time. ``keys``/``values`` here are views of the
    first ``length`` positions of fixed buffers.

    Args:
        capacity: Most positions the layer will hold (prompt + response).
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            B, H, _, D = key_states.shape
            self.key_buffer = key_states.new_empty(B, H, self.capacity, D)
            self.value_buffer = value_states.new_empty(B, H, self.capacity, D)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.keys = self.key_buffer[:, :, :end]  # (B, H, end, D)
        self.values = self.value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        end = self.get_seq_length()
        self.key_buffer = self.key_buffer[indices]  # (len(indices), H, capacity, D)
        self.value_buffer = self.value_buffer[indices]
        self.keys = self.key_buffer[:, :, :end]
        self.values = self.value_buffer[:, :, :end]
