"""The ``workbench`` command: the engine headless, for scripts and CI. Every command takes
``--json``; the exit code is 0 when all passed, 1 when a check, a tolerance or a sweep cell
failed (a CI gate), 2 on bad input, 130 on Ctrl-C.

The package by idea: ``parser`` (arguments, help, examples), ``commands`` (the stages and the
sweep), ``ncnn`` (to-ncnn, compare and featmask, with ARM targets) and ``common`` (what they
share: argument types, a factory's model and inputs, printing a result).
"""

from __future__ import annotations

import sys

from ..errors import WorkbenchError
from ..sweeps.factory import load_factory
from .common import _error, _json
from .parser import build_parser

__all__ = ["build_parser", "load_factory", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except WorkbenchError as e:
        if getattr(args, "json", False):
            _json({"ok": False, "error": _error(e)})
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2
