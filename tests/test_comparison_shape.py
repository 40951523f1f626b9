"""The comparison package stays readable: no function in it over MAX_LINES lines (issue 36
item 5). A longer one is split by idea (a phase, a step), not trimmed to fit."""

from __future__ import annotations

import ast
from pathlib import Path

import workbench.comparison

MAX_LINES = 80
PACKAGE = Path(workbench.comparison.__file__).parent


def _long_functions(root: Path, limit: int) -> list[str]:
    """'path:line name (n lines)' for every function or method under ``root`` whose
    ``def`` to last line (docstring included, decorators not) spans more than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} "
                                 f"{node.name} ({n} lines)")
    return found


def test_no_function_in_comparison_is_over_80_lines():
    long = _long_functions(PACKAGE, MAX_LINES)
    assert not long, (f"functions over {MAX_LINES} lines in workbench/comparison/ (split each "
                      "by idea):\n" + "\n".join(long))


def test_the_walk_sees_every_module_and_counts_from_def_to_the_last_line(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.py").write_text(
        "class C:\n    def method(self):\n" + "        x = 1\n" * 3 + "\n"
        "@staticmethod\ndef short():\n    return 1\n")
    (tmp_path / "top.py").write_text("async def f():\n" + "    pass\n" * 4)
    assert _long_functions(tmp_path, 4) == [f"{tmp_path.name}/top.py:1 f (5 lines)"]
    assert _long_functions(tmp_path, 3) == [f"{tmp_path.name}/sub/deep.py:2 method (4 lines)",
                                            f"{tmp_path.name}/top.py:1 f (5 lines)"]
    assert len(list(PACKAGE.rglob("*.py"))) > 30  # align/ and the rest, not one folder
