"""The final answer of a completion.

The answer of a completion is the content of its **last** complete ``\\boxed{...}`` (or
``\\fbox{...}``; braces balanced, ``\\{`` and ``\\}`` are not braces); when there is none, the text
after the last "the answer is" on its line, or the span of a Markdown emphasis opening it ("The
answer is **5**." gives ``5``), when its braces balance (a cut-off ``\\boxed{12`` is no answer).
"""

from __future__ import annotations

import re

_BOX_OPENING = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped char (skipped) or a brace
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?[ \t]*([^\n]+)", re.IGNORECASE)
# Markdown emphasis opening the text after "the answer is" (bold, italic, both; with * or _):
# the answer is the emphasised span.
_EMPHASIS = re.compile(r"(\*{1,3}|_{1,3})(.+?)\1")


def extract_boxed(text: str) -> str | None:
    """Returns the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``, else None.

    One pass over the braces of ``text`` (linear time, whatever the nesting).
    """
    openings = {m.end() - 1 for m in _BOX_OPENING.finditer(text)}  # positions of their "{"
    if not openings:
        return None
    stack: list[int] = []
    last: tuple[int, int] | None = None
    for token in _BRACE_TOKENS.finditer(text):
        if token.group() == "{":
            stack.append(token.start())
        elif token.group() == "}" and stack:
            start = stack.pop()
            if start in openings and (last is None or start > last[0]):
                last = (start, token.start())
    return None if last is None else text[last[0] + 1 : last[1]].strip()


def balanced(text: str) -> bool:
    """Whether the braces of ``text`` balance (``\\{`` and ``\\}`` are not braces)."""
    depth = 0
    for token in _BRACE_TOKENS.finditer(text):
        depth += {"{": 1, "}": -1}.get(token.group(), 0)
        if depth < 0:
            return False
    return depth == 0


def extract_answer(completion: str) -> str | None:
    """The final answer: the last ``\\boxed{}``, else the last "the answer is X", else None.

    An answer after "the answer is" whose braces do not balance is none: a cut-off
    ``\\boxed{12`` is not completed into ``12``.
    """
    boxed = extract_boxed(completion)
    if boxed is not None:
        return boxed
    matches = _ANSWER_IS.findall(completion)
    if not matches:
        return None
    answer = _unwrap_answer(matches[-1])
    return answer if answer and balanced(answer) else None


def _unwrap_answer(text: str) -> str:
    """The answer in the text after "the answer is": the span of a Markdown emphasis opening
    it (``**5**``, ``__5__``, ``*5*``, ``***5***``), else the whole text; then without stray
    emphasis marks at its ends (``**The answer is 5**``), a final full stop and ``$`` signs."""
    text = text.strip()
    emphasis = _EMPHASIS.match(text)
    if emphasis is not None:
        text = emphasis.group(2)
    return text.strip().strip("*_").strip().rstrip(".").strip().strip("$").strip()
