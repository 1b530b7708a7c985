"""Tables and figures, one way for every command (analysis, fine-tuning report, benchmarks).

``format_table`` draws a plain-text table (right-aligned, for terminals and ``table.txt``) or a Markdown one
(pastes into BENCHMARKS.md); ``save_figure`` writes a matplotlib figure as a PNG on the file-only backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, style: Literal["plain", "markdown"] = "plain"
) -> str:
    """A table of ``rows`` under ``headers`` (floats in 4 significant digits, the rest as ``str``): ``plain``
    right-aligns columns under a dashed rule, ``markdown`` makes a left-aligned pipe table."""

    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    markdown = style == "markdown"

    def line(row: Sequence[str]) -> str:
        padded = [c.ljust(w) if markdown else c.rjust(w) for c, w in zip(row, widths, strict=True)]
        return f"| {' | '.join(padded)} |" if markdown else "  ".join(padded)

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|" if markdown else "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *map(line, cells)])


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, imported on first use (slow to import; few commands draw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, *, tight_layout: bool = True) -> Path:
    """Save ``fig`` as a PNG at 120 dpi, cropped, and close it (``tight_layout=False``: a colour bar spans axes)."""
    if tight_layout:
        fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return path
