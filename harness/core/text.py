"""Text for one-line messages: verdict reasons, errors, notes."""

from __future__ import annotations


def one_line(text: str, width: int) -> str:
    """`text` with its whitespace runs (newlines included) made single spaces, cut to `width` characters with
    "..." when longer."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
