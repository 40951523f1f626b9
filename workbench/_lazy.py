"""Lazy attributes for a package: a name is imported on first use, so importing is cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, table: dict[str, tuple[str, str | None]],
                    names: list[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``table`` maps a public name to
    (module, attribute), attribute ``None`` meaning the module itself; a value once imported
    is cached in the package's namespace."""

    def __getattr__(name: str) -> Any:
        if name in table:
            module, attr = table[name]
            mod = importlib.import_module(module)
            value = mod if attr is None else getattr(mod, attr)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
