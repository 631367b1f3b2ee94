"""The query of a completion: the last ```sql block, and the tokens of SQL text.

Before any parsing, a completion longer than :data:`MAX_COMPLETION_CHARS` is refused, and
extraction runs in linear time.
"""

from __future__ import annotations

import re
from typing import Iterator

#: Longest completion the verifier reads, in characters (a model's completion is a few thousand
#: tokens; reading a longer text would hold the GIL, and so stall the deadline checks of the
#: other threads, for a fraction of a second per 10 MB).
MAX_COMPLETION_CHARS = 1_000_000

_SQL_BLOCK_RE = re.compile(r"```sql\b[ \t]*\n?(.*?)```", re.IGNORECASE | re.DOTALL)

# One SQL token per match. Whitespace and comments match unnamed groups and are skipped; quoted
# strings and identifiers are single tokens so that their content is never read as SQL.
_TOKEN_RE = re.compile(
    r"""
      \s+
    | --[^\n]*
    | /\*.*?(?:\*/|\Z)
    | (?P<quoted>'(?:[^']|'')*'?|"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?)
    | (?P<word>[^\W\d]\w*)
    | (?P<symbol>\S)
    """,
    re.VERBOSE | re.DOTALL,
)


def extract_sql(completion: str) -> str | None:
    """Returns the content of the last closed ```sql fenced block, stripped, or None.

    The tag is case-insensitive (```SQL works, ```sqlite does not). A block must be closed by
    ```: an unclosed one at the end of the text (e.g. a completion cut at the length limit) is not
    an answer, as in the original DPH-RL code; an earlier closed block is still found.

    Args:
        completion: The model's whole completion.
    """
    # Nothing after the last ``` can close a block: cut it, so that an unclosed opening fence
    # does not send the lazy pattern scanning to the end of a long text.
    blocks = _SQL_BLOCK_RE.findall(completion[: completion.rfind("```") + 3])
    return blocks[-1].strip() if blocks else None


def _code_tokens(sql: str) -> Iterator[re.Match]:
    """Yields the tokens of ``sql`` that are not whitespace or comments."""
    for match in _TOKEN_RE.finditer(sql):
        if match.lastgroup is not None:
            yield match


def has_top_level_order_by(sql: str) -> bool:
    """Whether ``sql`` has an ``ORDER BY`` outside all parentheses, strings and comments.

    ``ORDER BY`` inside a sub-query, a CTE body, a window (``OVER (ORDER BY ...)``) or an
    aggregate's argument list does not order the final result and does not count.

    Args:
        sql: One SQL statement.
    """
    depth = 0
    previous = ""
    for match in _code_tokens(sql):
        token = match.group().upper()
        if token == "(":
            depth += 1
        elif token == ")":
            depth = max(depth - 1, 0)
        elif token == "BY" and previous == "ORDER" and depth == 0:
            return True
        previous = token
    return False
