"""The figure table every benchmark prints: aligned columns, then a one-line summary."""

from __future__ import annotations

from collections.abc import Sequence


def print_figures(table: Sequence[Sequence[str]], passed: list[str], failed: list[str],
                  missing: list[str], notes: Sequence[str] = ()) -> None:
    """``table`` starts with its header row; ``notes`` print between table and summary."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                        for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for line in notes:
        print(line)
    summary = f"summary: {len(passed)}/{len(passed) + len(failed)} figures within target"
    if failed:
        summary += "; FAIL: " + ", ".join(failed)
    if missing:
        summary += f"; {len(missing)} not available"
    print(summary)
