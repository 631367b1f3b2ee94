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


#: Stand-in contents that locate the message boundaries in a rendered chat template.
_TURN_MARK = "\x00policy-turn\x00"
_OBSERVATION_MARK = "\x00observation\x00"


def observation_markup(tokenizer, role: str = "user") -> tuple[str, str]:
    """The template text around an env observation between two policy turns: (before, after).

    ``before`` closes the policy's turn and opens a ``role`` message; ``after`` closes it and
    opens the next assistant turn, so ``before + observation + after`` continues a generated
    turn exactly as the chat template renders the whole conversation. Found by rendering a
    conversation with stand-in contents. Without a chat template: blank lines, as
    :func:`encode_prompt` joins messages.
    """
    if not getattr(tokenizer, "chat_template", None):
        return "\n\n", "\n\n"
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _TURN_MARK},
            {"role": role, "content": _OBSERVATION_MARK}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    if text.count(_TURN_MARK) != 1 or text.count(_OBSERVATION_MARK) != 1:
        raise ValueError(
            f"the chat template does not render a {role!r} message after an assistant turn with "
            "its content once; use a template that renders every message's content, or another "
            "observation_role for the env."
        )
    between = text.split(_TURN_MARK, 1)[1]
    before, after = between.split(_OBSERVATION_MARK, 1)
    return before, after


def encode_observation(tokenizer, content: str, *, role: str = "user", turn_closed: bool) -> list[int]:
    """Token ids that append an env observation to a generated turn and open the next turn.

    The observation stays text whatever it contains: a tool or database result that spells a
    special token (``<|im_end|>``, ``<|im_start|>assistant``) is tokenized as ordinary text
    (:func:`control_texts`), so it can neither close the observation nor open a turn; lone
    surrogates (bytes of invalid UTF-8) are written as escapes (:func:`as_text`).

    Args:
        tokenizer: A Hugging Face tokenizer.
        content: The observation text.
        role: The observation message's chat role.
        turn_closed: The generated turn ended with the EOS token (a stop): its text, when the
            template's turn-closing text starts with it, is not repeated.
    """
    content = as_text(content)
    before, after = observation_markup(tokenizer, role)
    eos = tokenizer.eos_token
    if turn_closed and eos and before.startswith(eos):
        before = before[len(eos):]
    if not any(control in content for control in control_texts(tokenizer)):
        return list(tokenizer(before + content + after, add_special_tokens=False)["input_ids"])
    parts = [tokenizer(before, add_special_tokens=False)["input_ids"],
             tokenizer(content, add_special_tokens=False, split_special_tokens=True)["input_ids"],
             tokenizer(after, add_special_tokens=False)["input_ids"]]
    return [token for part in parts for token in part]


def as_text(content: str) -> str:
    """``content`` with what is not text written as escapes (no tokenizer takes a lone
    surrogate): a byte of invalid UTF-8 kept by ``surrogateescape`` (U+DC80..U+DCFF, e.g. from a
    database text) as ``\\xff``, any other lone surrogate as ``\\ud800``; other text unchanged."""
    try:
        content.encode("utf-8")
        return content
    except UnicodeEncodeError:
        pass
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff"
                   else f"\\u{ord(c):04x}" if "\ud800" <= c <= "\udfff" else c for c in content)


def control_texts(tokenizer) -> list[str]:
    """The texts of the tokenizer's special tokens (``<|im_end|>``, ``<|im_start|>``, EOS, ...):
    in an observation they are spelled out as ordinary text, never turned into the control tokens
    that end a message or open a turn."""
    return [token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
            if token.special and token.content]
