"""Chat prompts as token ids: the one place that applies a tokenizer's chat template.

A leaf module (it imports nothing from ``rllib_dph``), so the rollout loop, the SFT code and the
model builders can all use it without import circles.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def encode_prompt(tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a chat prompt, ready for generation, as a plain list.

    With a chat template the messages are rendered with ``add_generation_prompt=True`` and the
    text is tokenized without adding special tokens (the template already holds them). Without
    one, the message contents are joined by blank lines and tokenized normally.

    Args:
        tokenizer: A Hugging Face tokenizer.
        messages: Chat messages ``{"role", "content"}``.
    """
    if getattr(tokenizer, "chat_template", None):
        chat = [dict(m) for m in messages]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])
