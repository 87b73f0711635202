"""Markdown table cells for the stage reports: a `|` inside a cell is escaped, never dropped or replaced."""

from __future__ import annotations


def cell(value) -> str:
    """`value` as one GFM table cell: pipes escaped (`\\|`, inside code spans too), newlines as spaces."""
    return str(value).replace("\\|", "|").replace("|", "\\|").replace("\n", " ")
