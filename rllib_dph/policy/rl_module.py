"""An RLlib ``TorchRLModule`` around a Hugging Face causal language model."""

from __future__ import annotations

import contextlib
from typing import Any, Collection, Dict, Optional, Union

import torch
import torch.nn.functional as F
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override
from ray.rllib.utils.typing import StateDict

from rllib_dph import columns as C
from rllib_dph.policy import lora
from rllib_dph.losses.tokens import token_logprobs, token_stats
from rllib_dph.models.transformers_api import cache_kwargs, enable_activation_checkpointing, output_cache
from rllib_dph.policy.full_state import full_model_state, is_sharded, load_full_model_state

#: Keys of the training forward pass output.
LOGP = "logp"  # (B, L) log π_θ(x_t | x_<t) at the sampling temperature, 0 at position 0
ENTROPY = "entropy"  # (B, L) entropy of π_θ(· | x_<t)
TOPK_LOGP = "topk_logp"  # (B, L, K) log π_θ of the rollout engine's top-K ids


def next_token_logits(model, batch: Dict[str, Any]) -> torch.Tensor:
    """(B, L-1, V) logits of a HF causal LM over right-padded sequences; [:, t] predicts token t+1."""
    input_ids = batch[C.INPUT_IDS].long()  # (B, L)
    attention_mask = batch[C.ATTENTION_MASK].long()  # (B, L)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    )
    return out.logits[:, :-1]  # (B, L-1, V)


#: Config attributes of models whose output layer is more than ``lm_head(hidden)``; those take
#: the full ``model(...)`` forward in :func:`response_logits`.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def response_logits(
    model, batch: Dict[str, Any], *, share_prompts: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) logits at the N positions that predict a response token, and where they are.

    The LM head runs only on the hidden states that predict response tokens: on a batch of
    64-token prompts and 64-token responses that is half the head's work, and far less memory
    for the (·, V) logits. The decoder runs once per distinct prompt when rows share prompts
    (a GRPO group: :func:`shared_prompt_hidden`), else on the whole right-padded sequences.
    Models whose output layer is more than ``lm_head(hidden)`` (logit soft-capping or scaling)
    take the full forward pass instead, so every model gets its own logits.

    Args:
        model: A HF causal LM.
        batch: ``INPUT_IDS``, ``ATTENTION_MASK`` and ``RESPONSE_MASK`` (B, L).
        share_prompts: Allow :func:`shared_prompt_hidden` (off for FSDP2-sharded models, whose
            layers are gathered once per forward pass).

    Returns:
        logits (N, V) in the compute dtype, and ``where`` (B, L-1) bool: position t predicts the
        response token t + 1.
    """
    where = batch[C.RESPONSE_MASK][:, 1:].bool()  # (B, L-1)
    config = model.config.get_text_config(decoder=True)
    if any(getattr(config, name, None) for name in _LOGIT_TRANSFORMS):
        return next_token_logits(model, batch)[where], where  # (N, V)
    hidden = None
    if share_prompts and not activation_checkpointing(model):
        hidden = shared_prompt_hidden(model.get_decoder(), batch)  # (N, H) or None
    if hidden is None:
        input_ids = batch[C.INPUT_IDS].long()  # (B, L)
        attention_mask = batch[C.ATTENTION_MASK].long()  # (B, L)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
        hidden = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state[:, :-1][where]  # (N, H)
    return model.get_output_embeddings()(hidden), where  # (N, V)


def activation_checkpointing(model) -> bool:
    """Whether a HF model has activation (gradient) checkpointing on (either transformers API)."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def shared_prompt_hidden(decoder, batch: Dict[str, Any]) -> Optional[torch.Tensor]:
    """(N, H) decoder states that predict the response tokens, each distinct prompt run once.

    The rows of a GRPO group share their prompt: the decoder runs on the U distinct prompts
    (right-padded to the longest, keeping their KV cache), the cache is copied to the B rows
    that own each prompt (``batch_select_indices``: an index, so the gradients of every row flow
    back into the one prompt pass), and the decoder runs on the responses alone on top of it,
    at their true positions. Response token 0 is predicted by the prompt's last state, token j
    by response state j - 1. Exact: the same attention over the same keys, so the states equal
    the full pass's up to float summation order (~1e-6 in fp32). Returns None (take the full
    pass) when it would not save token slots, U·P_max + B·R_max >= B·L (e.g. no shared prompt).

    Args:
        decoder: The causal LM's decoder (``model.get_decoder()``), not gradient-checkpointed
            (HF turns the KV cache off under checkpointing).
        batch: ``INPUT_IDS``, ``ATTENTION_MASK``, ``RESPONSE_MASK`` (B, L): right-padded
            ``prompt + response`` rows; rows without response tokens are left out.
    """
    response_mask = batch[C.RESPONSE_MASK].bool()  # (B, L)
    rows = torch.nonzero(response_mask.any(-1)).squeeze(-1)  # (B',) rows with a response
    input_ids = batch[C.INPUT_IDS][rows].long()  # (B', L)
    prompt_len = response_mask[rows].long().argmax(-1)  # (B',) first response position
    response_len = response_mask[rows].sum(-1)  # (B',)
    num_rows, width = input_ids.shape
    if num_rows == 0 or int(prompt_len.min()) == 0:
        return None
    if not _prompt_then_response(batch, rows, prompt_len, response_len):
        return None
    prompt_ids, owner = distinct_prompts(input_ids, prompt_len)  # (U, P), (B',)
    R = int(response_len.max())
    if prompt_ids.numel() + num_rows * R >= num_rows * width:
        return None
    prompt_mask = (prompt_ids >= 0).long()  # (U, P); padding is -1
    prompt_out = decoder(
        input_ids=prompt_ids.clamp(min=0), attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0), use_cache=True,
    )
    cache = output_cache(prompt_out)
    cache.batch_select_indices(owner)  # (U, ...) -> (B', ...)
    valid = torch.arange(R, device=rows.device)[None] < response_len[:, None]  # (B', R)
    positions = prompt_len[:, None] + torch.arange(R, device=rows.device)[None]  # (B', R)
    response_hidden = decoder(
        input_ids=input_ids.gather(1, positions.clamp(max=width - 1)) * valid,  # (B', R)
        attention_mask=torch.cat([prompt_mask[owner], valid.long()], dim=1),  # (B', P + R)
        position_ids=positions, use_cache=True, **cache_kwargs(decoder, cache),
    ).last_hidden_state  # (B', R, H)
    last_prompt = prompt_out.last_hidden_state[owner, prompt_len - 1]  # (B', H)
    hidden = torch.cat([last_prompt[:, None], response_hidden[:, :-1]], dim=1)  # (B', R, H)
    return hidden[valid]  # (N, H), row-major like ``where``


def _prompt_then_response(batch, rows, prompt_len, response_len) -> bool:
    """Whether each row is ``prompt + response`` from position 0 with nothing attended after."""
    steps = torch.arange(batch[C.INPUT_IDS].shape[1], device=rows.device)[None]  # (1, L)
    end = (prompt_len + response_len)[:, None]  # (B', 1)
    response = (steps >= prompt_len[:, None]) & (steps < end)  # (B', L)
    return bool(
        torch.equal(batch[C.RESPONSE_MASK][rows].bool(), response)
        and torch.equal(batch[C.ATTENTION_MASK][rows].bool(), steps < end)
    )


def distinct_prompts(input_ids: torch.Tensor, prompt_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct prompts of the rows, right-padded with -1, and each row's prompt index.

    Args:
        input_ids: (B, L) token ids of ``prompt + response`` rows.
        prompt_len: (B,) prompt length of each row.

    Returns:
        prompts (U, P_max) in order of first appearance, -1 after each prompt's end, and
        owner (B,): row b's prompt is ``prompts[owner[b]]``.
    """
    index: dict[tuple, int] = {}  # prompt -> its index, in order of first appearance
    rows = input_ids.tolist()  # one device-to-host copy
    owner = [index.setdefault(tuple(ids[:n]), len(index)) for ids, n in zip(rows, prompt_len.tolist())]
    width = max(map(len, index), default=0)
    padded = [list(ids) + [-1] * (width - len(ids)) for ids in index]
    prompts = torch.tensor(padded, dtype=input_ids.dtype, device=input_ids.device)
    prompts = prompts.reshape(len(index), width)  # (U, P); (0, 0) when there is no row
    return prompts, torch.tensor(owner, dtype=torch.long, device=input_ids.device)


class ResponseLM(torch.nn.Module):
    """A HF causal LM whose forward returns :func:`response_logits`: (N, V) logits, (B, L-1) where.

    A module, not a bare function, so that its call is the model's one forward: an FSDP2-sharded
    model (``sharding.shard_response_lm``) gathers its root parameters (embeddings, final norm,
    LM head) in this module's forward hooks; calling the decoder and the head one by one from
    outside would find them still sharded. ``lm`` stays the HF model (its state-dict keys are
    the ones rollout engines load).
    """

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask, C.RESPONSE_MASK: response_mask}
        return response_logits(self.lm, batch, share_prompts=not is_sharded(self))

    def logits(self, batch: Dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` on a batch's ``INPUT_IDS``, ``ATTENTION_MASK``, ``RESPONSE_MASK``."""
        return self(batch[C.INPUT_IDS], batch[C.ATTENTION_MASK], batch[C.RESPONSE_MASK])


def scatter_tokens(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """(N, ...) values at the ``where`` (B, L-1) positions → (B, L, ...), 0 elsewhere and at t = 0."""
    out = values.new_zeros(where.shape + values.shape[1:])  # (B, L-1, ...)
    out[where] = values
    return F.pad(out, (0, 0) * (values.dim() - 1) + (1, 0))  # (B, L, ...)


def autocast(device: torch.device, dtype: torch.dtype):
    """``torch.autocast`` to ``dtype`` on ``device``'s type; no autocast for ``float32``.

    Mixed precision: matmuls run in ``dtype`` while the parameters keep their own dtype (fp32
    master weights on the learner); gradients flow back to the parameters in their dtype.
    """
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def sequence_logprobs(logits: torch.Tensor, batch: Dict[str, Any], temperature: float) -> torch.Tensor:
    """(B, L) log-prob of every token given its prefix at ``temperature``; 0 at position 0."""
    targets = batch[C.INPUT_IDS][:, 1:].long()  # (B, L-1)
    logp = token_logprobs(logits, targets, temperature=temperature)  # (B, L-1)
    return F.pad(logp, (1, 0))  # (B, L)


class LLMRLModule(TorchRLModule):
    """Policy π_θ(response | prompt) given by a HF causal LM.

    ``model_config`` keys:
        model: Name or path of the model (see ``rllib_dph.models.hub.resolve_model``).
        dtype: Compute dtype of the forward pass (``"float32"``, ``"bfloat16"``, ``"float16"``).
            The parameters are always float32 (master weights, so the optimizer state is fp32
            too and small updates are not rounded away); below float32 the model runs under
            ``torch.autocast(dtype=...)`` (mixed precision). Log-probs and entropies are
            computed from the logits in float32 either way.
        temperature: Sampling temperature; log-probs are those of softmax(logits / temperature),
            the distribution the rollout engine sampled from.
        gradient_checkpointing: Trade compute for memory on long sequences.
        lora: None (full fine-tuning) or LoRA settings (``rllib_dph.policy.lora``): the base weights are
            frozen and only the adapters train; :meth:`get_state` is then the adapter state.
        entropy_with_grad: Keep the entropy in the autograd graph (needed for an entropy bonus).

    The training forward pass takes a batch of right-padded ``prompt + response`` sequences
    (``columns.INPUT_IDS``, ``columns.ATTENTION_MASK``, ``columns.RESPONSE_MASK``) and returns, at
    every response token, its log-prob given its prefix (``LOGP``), the entropy of π_θ there
    (``ENTROPY``) and, when the batch carries the rollout engine's top-K ids, π_θ's log-probs of
    those ids (``TOPK_LOGP``); prompt and padding positions hold 0. The LM head and the
    log-softmax run on response positions only, with one shared logsumexp
    (``response_logits``, ``losses.token_stats``).
    """

    @override(TorchRLModule)
    def setup(self):
        from rllib_dph.models.folders import as_dtype
        from rllib_dph.models.hub import load_causal_lm

        cfg = self.model_config
        self.temperature = float(cfg.get("temperature", 1.0))
        self.entropy_with_grad = bool(cfg.get("entropy_with_grad", False))
        self.compute_dtype = as_dtype(cfg.get("dtype", "float32"))
        self.response_lm = ResponseLM(load_causal_lm(cfg["model"], dtype=torch.float32))
        self.lora_settings = cfg.get("lora")  # None: full fine-tuning
        if self.lora_settings is not None:
            lora.add_adapters(self.model, self.lora_settings)
        if cfg.get("gradient_checkpointing") and not self.inference_only:
            enable_activation_checkpointing(self.model)
        self.model.train(not self.inference_only)

    @property
    def model(self) -> torch.nn.Module:
        """The HF causal LM (inside :class:`ResponseLM`)."""
        return self.response_lm.lm

    @contextlib.contextmanager
    def no_sync(self):
        """DDP's ``no_sync`` for RLlib's update step, which calls it on every module when
        ``num_learners > 1``. A module that is not DDP-wrapped has no gradient all-reduce to
        defer: an FSDP2-sharded one reduce-scatters its gradients in every backward pass (so
        accumulated micro-batch gradients stay sharded)."""
        yield

    @override(TorchRLModule)
    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        """Log-probs, entropies (and top-K log-probs) at response positions; 0 elsewhere."""
        with autocast(self.model.device, self.compute_dtype):
            logits, where = self.response_lm.logits(batch)  # (N, V), (B, L-1)
        targets = batch[C.INPUT_IDS][:, 1:][where]  # (N,)
        topk_ids = batch[C.TOPK_IDS][:, 1:][where] if C.TOPK_IDS in batch else None  # (N, K)
        logp, entropy, topk = token_stats(
            logits, targets, temperature=self.temperature, topk_ids=topk_ids,
            entropy_with_grad=self.entropy_with_grad,
        )  # (N,), (N,), (N, K)
        out = {LOGP: scatter_tokens(logp, where), ENTROPY: scatter_tokens(entropy, where)}  # (B, L)
        if topk is not None:
            out[TOPK_LOGP] = scatter_tokens(topk, where)  # (B, L, K)
        return out

    @override(TorchRLModule)
    def _forward_inference(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        with torch.no_grad():
            return self._forward_train(batch)

    @override(TorchRLModule)
    def _forward_exploration(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self._forward_inference(batch)

    @override(TorchRLModule)
    def get_state(
        self,
        components: Optional[Union[str, Collection[str]]] = None,
        *,
        not_components: Optional[Union[str, Collection[str]]] = None,
        inference_only: bool = False,
        **kwargs,
    ) -> StateDict:
        """The HF model's state dict as CPU torch tensors in the parameters' dtype (float32).

        With LoRA, only the adapters (``lora.adapter_state``: tensors and settings; the base
        weights are those of ``model_config["model"]``): the weight sync and checkpoints move
        adapter tensors alone, and a rollout engine adds the same adapters to its base model.

        Keys are the HF model's own (e.g. ``model.layers.0.mlp.up_proj.weight``, not RLlib's
        default ``model.``-prefixed numpy arrays), so a rollout engine loads them directly; the
        engines cast floating tensors to their own dtype (e.g. bfloat16) on load.

        An FSDP2-sharded module gathers the full tensors into rank 0's host memory and returns
        {} on the other learners; every learner must call it (``ShardedLearnerGroup``).
        """
        if is_sharded(self.response_lm):
            state = full_model_state(self.model)
            return lora.adapter_state_of(state, self.lora_settings) if self.lora_settings is not None and state else state
        if self.lora_settings is not None:
            return lora.adapter_state(self.model, self.lora_settings)
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    @override(TorchRLModule)
    def set_state(self, state: StateDict) -> None:
        """Loads a :meth:`get_state` dict (tensors or numpy arrays); floats are cast to float32.

        An FSDP2-sharded module keeps its own shard of the full tensors (every learner calls it).
        A LoRA module loads an adapter state into its adapters.
        """
        if self.lora_settings is not None and is_sharded(self.response_lm):
            tensors = {k: torch.as_tensor(v) for k, v in state.items() if k != lora.LORA_SETTINGS}
            load_full_model_state(self.model, tensors, strict=False)
            return
        if self.lora_settings is not None:
            lora.load_adapter_state(self.model, state)
            return
        if is_sharded(self.response_lm):
            load_full_model_state(self.model, {k: torch.as_tensor(v) for k, v in state.items()})
            return
        device = next(self.model.parameters()).device
        self.model.load_state_dict(
            {k: torch.as_tensor(v).to(device) for k, v in state.items()}, strict=True
        )
