"""What every benchmark shares: round-robin timing, the tables it prints, and which engine
code printed them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def time_round_robin(variants: dict[str, Callable[[], Any]], runs: int, warmup: int,
                     settle: float = 0.0) -> dict[str, list[float]]:
    """Seconds per call of each variant; each round calls every variant once, in rotated
    order (so machine noise hits all alike), ``settle`` seconds after the previous call."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + runs):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if settle:
                time.sleep(settle)
            t0 = time.perf_counter()
            variants[name]()
            dt = time.perf_counter() - t0
            if r >= warmup:
                times[name].append(dt)
    return times


def print_figures(table: Sequence[Sequence[str]], passed: list[str], failed: list[str],
                  missing: list[str], notes: Sequence[str] = ()) -> None:
    """``table`` starts with its header row; ``notes`` print between table and summary."""
    print_table(table)
    for line in notes:
        print(line)
    summary = f"summary: {len(passed)}/{len(passed) + len(failed)} figures within target"
    if failed:
        summary += "; FAIL: " + ", ".join(failed)
    if missing:
        summary += f"; {len(missing)} not available"
    print(summary)


def print_table(table: Sequence[Sequence[str]]) -> None:
    """Rows of text in columns: the first left-aligned, the rest right-aligned; the first
    row is the header, underlined."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                        for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def engine_state() -> str:
    """The workbench's commit, and its engine files changed since: a figure says which code
    printed it."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %cd",
                               "--date=format:%H:%M"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "workbench"], capture_output=True, text=True,
                               timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "workbench: git state unknown"
    changed = [ln[3:] for ln in dirty if ln.strip()]
    return (f"workbench at {head or '?'}"
            + (f", uncommitted changes in {', '.join(changed)}" if changed else ", clean"))
