"""Supervised fine-tuning on chat completions and multi-turn traces: encoding, length-bucketed batches, the loss and
a resumable training loop. Used by the tiny models' build (``tiny``) and by the warm starts of
pretrained chat models (``warm_start``)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rllib_dph.chat import encode_observation, encode_prompt
from rllib_dph.files import atomic_path

#: File of the resumable SFT state inside a checkpoint folder.
SFT_STATE = "sft_state.pt"


def encode_example(tokenizer, messages, completion: str | Sequence[str]) -> tuple[list[int], list[int]]:
    """Token ids of a chat prompt and its completion, and the SFT loss mask.

    A completion is one policy turn (a string) or a conversation: policy turns and env
    observations alternating, starting and ending with a policy turn (``[turn, observation,
    turn, ...]``, a ``rllib_dph.envs.sql.multiturn`` trace). Every policy turn is its text's
    tokens and the EOS token (``<|im_end|>``, the turn's stop); every observation is
    :func:`rllib_dph.chat.encode_observation`'s tokens after a closed turn, exactly what the
    rollout (``rllib_dph.rollout.take_turn``) appends between two generated turns.

    Args:
        tokenizer: Tokenizer with a chat template.
        messages: The prompt as chat messages.
        completion: The assistant's answer text, or the alternating turns and observations.

    Returns:
        ``(ids, loss_mask)``: ``loss_mask[t]`` is 1 on policy-turn tokens (the tokens the SFT
        loss covers, the rollout's ``RESPONSE_MASK``) and 0 on the prompt and observations.
    """
    parts = [completion] if isinstance(completion, str) else list(completion)
    if len(parts) % 2 == 0:
        raise ValueError(
            f"encode_example: a completion of {len(parts)} parts; give policy turns and observations "
            "alternating, starting and ending with a policy turn (an odd number of parts)."
        )
    ids = encode_prompt(tokenizer, messages)
    mask = [0] * len(ids)
    for i, text in enumerate(parts):
        if i % 2:  # an observation after a turn closed by EOS
            part = encode_observation(tokenizer, text, turn_closed=True)
        else:
            part = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids += part
        mask += [1 - i % 2] * len(part)
    return ids, mask


def bucketed_batches(lengths: Sequence[int], batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of batches of similar length, in random order.

    Sequences are shuffled, stably sorted by length and cut into batches of ``batch_size``, so
    each batch needs little padding; the batch order is then shuffled.

    Args:
        lengths: Length of every sequence.
        batch_size: Sequences per batch (the last batch may be smaller).
        rng: Source of randomness (seeded for determinism).

    Returns:
        Index arrays, one per batch.
    """
    order = rng.permutation(len(lengths))
    order = order[np.argsort(np.asarray(lengths)[order], kind="stable")]
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def collate(encoded: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pads encoded examples into a training batch.

    Args:
        encoded: ``(ids, loss_mask)`` pairs from :func:`encode_example`.
        pad_id: Padding token id.

    Returns:
        ``input_ids`` and ``attention_mask`` (B, T) and ``labels`` (B, T) holding the token id
        where the loss mask is 1 (policy turns) and -100 on prompt, observations and padding.
    """
    T = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), T), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(encoded), T), dtype=torch.long)  # (B, T)
    labels = torch.full((len(encoded), T), -100, dtype=torch.long)  # (B, T)
    for i, (ids, mask) in enumerate(encoded):
        row = torch.tensor(ids)  # (T_i,)
        input_ids[i, : len(ids)] = row
        attention_mask[i, : len(ids)] = 1
        labels[i, : len(ids)] = torch.where(torch.tensor(mask, dtype=torch.bool), row, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def lr_at(step: int, spec) -> float:
    """Learning rate of an optimizer step: linear warm-up, then cosine decay to ``min_lr_ratio``."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.sft_steps - spec.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return spec.lr * (spec.min_lr_ratio + (1.0 - spec.min_lr_ratio) * cosine)


def completion_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the completion tokens of a batch (token-mean).

    The output head runs only on the positions that predict a completion token (a policy-turn
    token), which saves most of its cost (prompts are the larger part of each sequence).
    """
    out = model.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    hidden = out.last_hidden_state  # (B, T, H)
    targets = batch["labels"][:, 1:]  # (B, T-1)
    keep = targets != -100  # (B, T-1)
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])  # (N, V)
    return F.cross_entropy(logits.float(), targets[keep])


def sft(
    model,
    encoded: Sequence[tuple[list[int], list[int]]],
    spec,
    *,
    pad_id: int,
    progress: bool = True,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
) -> list[float]:
    """Supervised fine-tuning on completion tokens with AdamW and warm-up + cosine decay.

    Resumable: with ``checkpoint_dir`` the model, optimizer, step and losses are saved there
    every ``checkpoint_every`` steps (written to a temporary file, then renamed), and a later
    call with the same arguments continues from the last save: the batch order is replayed from
    the seed, so the result is the one an uninterrupted run gives.

    Args:
        model: A HF causal LM, trained in place on the device its parameters are on.
        encoded: ``(ids, loss_mask)`` training examples (:func:`encode_example`).
        spec: The schedule: ``sft_steps``, ``batch_size``, ``lr``, ``warmup_steps``,
            ``min_lr_ratio``, ``weight_decay``, ``grad_clip`` and ``seed`` (of the batch order),
            e.g. a ``tiny.TinyModelSpec`` or a ``warm_start.WarmStartSpec``.
        pad_id: Padding token id.
        progress: Show a tqdm progress bar.
        checkpoint_dir: Folder for the resumable state (None: no saves).
        checkpoint_every: Steps between saves (0: none).

    Returns:
        The training loss of every step.
    """
    optimizer = _adamw(model, spec)
    state_path = Path(checkpoint_dir) / SFT_STATE if checkpoint_dir is not None else None
    losses = _load_state(state_path, model, optimizer)
    rng = np.random.default_rng(spec.seed)
    lengths = [len(ids) for ids, _ in encoded]
    batches = _batches_left(len(losses), lengths, spec.batch_size, rng)  # replay up to the saved step
    device = next(model.parameters()).device
    model.train()
    bar = tqdm(range(len(losses), spec.sft_steps), desc="SFT", disable=not progress, dynamic_ncols=True,
               initial=len(losses), total=spec.sft_steps)
    for step in bar:
        if not batches:
            batches = bucketed_batches(lengths, spec.batch_size, rng)
        batch = {k: v.to(device) for k, v in collate([encoded[i] for i in batches.pop()], pad_id).items()}
        lr = lr_at(step, spec)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = completion_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr:.1e}")
        done = step + 1
        if state_path is not None and checkpoint_every and (done % checkpoint_every == 0) and done < spec.sft_steps:
            _save_state(state_path, model, optimizer, losses)
    model.eval()
    return losses


def _batches_left(steps: int, lengths: Sequence[int], batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The batches of the current epoch still to train on after ``steps`` steps.

    Draws the epochs from ``rng`` exactly as the training loop does, so a resumed run continues
    with the batch the interrupted one would have taken next.
    """
    batches: list[np.ndarray] = []
    for _ in range(steps):
        if not batches:
            batches = bucketed_batches(lengths, batch_size, rng)
        batches.pop()
    return batches


def _adamw(model, spec) -> torch.optim.AdamW:
    """AdamW with ``spec.weight_decay`` on the matrices (dim >= 2) and none on biases and norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.95),
    )


def _load_state(state_path: Path | None, model, optimizer) -> list[float]:
    """Loads a saved SFT state into ``model`` and ``optimizer``; returns its losses ([] if none)."""
    if state_path is None or not state_path.is_file():
        return []
    state = torch.load(state_path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return list(state["losses"])


def _save_state(state_path: Path, model, optimizer, losses: list[float]) -> None:
    """Saves the resumable SFT state atomically (``files.atomic_path``: never half-written)."""
    with atomic_path(state_path) as tmp:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "losses": losses}, tmp)
