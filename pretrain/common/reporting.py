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
    """A table of ``rows`` under ``headers``; floats in 4 significant digits, everything else as ``str``.

    ``plain``: right-aligned columns under a dashed rule; ``markdown``: a left-aligned pipe table."""

    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if style == "markdown":
        lines = [
            "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        ]
        lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
        return "\n".join(lines)
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display on servers or in tests); imported on first
    use because matplotlib is slow to import and only the commands that draw need it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, *, tight_layout: bool = True) -> Path:
    """Save ``fig`` as a PNG at 120 dpi, cropped to the drawing, and close it. ``tight_layout=False`` where a
    colour bar spans several axes (matplotlib cannot lay those out and warns)."""
    if tight_layout:
        fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return path
