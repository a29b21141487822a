"""Marked blocks of the docs: what sits between ``<!-- NAME -->`` and ``<!-- /NAME -->``, which
tests compare with what a script prints from an evidence file."""

from __future__ import annotations


def marked_block(text: str, name: str) -> str:
    """The lines between the ``<!-- name -->`` line and the ``<!-- /name -->`` line of ``text``,
    without the newline before the closing marker."""
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->")[0]
