"""The Python a panel stands for: engine calls for its current settings, ready to paste.

Like Polygraphy's "every run can emit the script it stands for": each panel renders its
settings as one engine call, and a panel whose input is not on disk yet includes the
calls of the panels before it, so the code always runs on its own given ``model`` and
``inputs``.
"""

from __future__ import annotations

from typing import Any

HEADER = "import workbench as wb"
PREAMBLE = "# model, inputs: the torch.nn.Module and the example inputs given to the widget"


def literal(value: Any) -> str:
    """A Python literal for a setting (repr, with paths as plain strings)."""
    from pathlib import Path

    if isinstance(value, Path):
        return repr(str(value))
    return repr(value)


def call(target: str, fn: str, args: list[str], kwargs: dict[str, Any], width: int = 96) -> str:
    """``target = fn(args..., key=value, ...)``, wrapped under the open parenthesis."""
    parts = list(args) + [f"{k}={v if isinstance(v, Code) else literal(v)}"
                          for k, v in kwargs.items()]
    head = f"{target} = {fn}("
    one = head + ", ".join(parts) + ")"
    if len(one) <= width:
        return one
    lines, line = [], head
    indent = " " * len(head)
    for i, part in enumerate(parts):
        piece = part + ("," if i < len(parts) - 1 else ")")
        if line.strip() and len(line) + len(piece) + 1 > width and line != head:
            lines.append(line.rstrip())
            line = indent
        line += piece + " "
    lines.append(line.rstrip())
    return "\n".join(lines)


class Code(str):
    """A keyword value written as-is (a variable name), not as a literal."""


def program(body: list[str], needs_model: bool) -> str:
    """The full snippet: the import, a note on ``model``/``inputs`` when used, the body."""
    lines = [HEADER, ""]
    if needs_model:
        lines.append(PREAMBLE)
    lines += body
    return "\n".join(lines) + "\n"
