"""The tutorial notebooks run top to bottom in this environment and are stored clean.

Each notebook is executed from a temporary copy, so the workspaces it creates (``runs/...``,
relative to the notebook) land in ``tmp_path``. The notebooks assert their own key results,
so a regression in the engine fails the cell that shows it.

Running every notebook is among the longest work in the suite, and ``pytest -n 2 --dist
loadfile`` gives all tests of one file to one worker. So the notebooks are dealt into two
shares (alternately, in name order, so a new notebook lands in one of them by itself): this
file runs the first, ``test_notebooks_more.py`` the second, and both workers share the load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from queue import Empty
from typing import Any
from unittest import mock

import nbformat
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import NoSuchKernel
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
SHARES = (PATHS[0::2], PATHS[1::2])  # executed by this file and by test_notebooks_more.py
KERNEL = "python3"
CELL_TIMEOUT = 300  # every cell here takes well under a minute
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _kernel_python() -> str | None:
    """The interpreter the ``python3`` kernel spec would start, as jupyter_client resolves it."""
    try:
        cmd = KernelManager(kernel_name=KERNEL).format_kernel_cmd()
    except NoSuchKernel:
        return None
    return cmd[0] if cmd else None


@pytest.fixture
def python3_kernel(tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> str:
    """Make ``python3`` start a kernel in this interpreter's environment.

    ipykernel's own spec does that when it is installed here (its argv ``python`` is replaced
    by ``sys.executable``); a ``python3`` spec in a user or system folder may point elsewhere.
    Then a spec for ``sys.executable`` is written to a temp folder put first on JUPYTER_PATH.
    """
    if _kernel_python() != sys.executable:
        spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / KERNEL
        spec_dir.mkdir(parents=True)
        spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"Python 3 ({sys.executable})", "language": "python"}
        (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
        monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
            [str(spec_dir.parent.parent), *filter(None, [os.environ.get("JUPYTER_PATH")])]))
    return KERNEL


def _failure(nb: nbformat.NotebookNode, name: str, error: Exception) -> str:
    """Which cell failed, its source, and its error without terminal colours."""
    for index, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            tb = "\n".join(ANSI.sub("", line) for line in errors[0].get("traceback", []))
            return (f"{name}: cell {index} failed: {errors[0].get('ename')}: "
                    f"{errors[0].get('evalue')}\n--- cell source ---\n{cell.source}\n"
                    f"--- traceback ---\n{tb}")
    return f"{name}: {type(error).__name__}: {ANSI.sub('', str(error))}"


def test_notebooks_exist() -> None:
    assert PATHS, f"no notebooks in {NOTEBOOKS}"


def test_python3_kernel_is_this_interpreter(python3_kernel: str) -> None:
    assert _kernel_python() == sys.executable


def test_shares_hold_every_notebook_once() -> None:
    assert sorted(SHARES[0] + SHARES[1]) == PATHS


class _Client(NotebookClient):
    """nbclient whose wait for a cell's execute_reply polls the shell socket in 1 s slices.

    In full runs, 00-quickstart (a cell sending ~200 widget messages on iopub) sometimes sat
    for exactly one cell timeout after the kernel had replied and gone idle, then went on
    and passed: the shell socket's readiness was missed by the asyncio poll and only seen
    when the poll timed out (pyzmq re-checks then). Short polls see it within a second.
    """

    async def async_start_new_kernel_client(self) -> Any:
        kc = await super().async_start_new_kernel_client()
        channel, get_msg = kc.shell_channel, kc.shell_channel.get_msg

        async def sliced(timeout: float | None = None) -> dict:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                try:
                    return await get_msg(timeout=max(0.0, min(1.0, left)))
                except Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise

        channel.get_msg = sliced
        return kc


def run_notebook(path: Path, kernel: str, tmp_path: Path) -> None:
    """Execute a copy of ``path`` in ``tmp_path``; fail with the failing cell and its error.

    The Jupyter runtime folder (kernel connection files, ``wb.ui.netron`` registrations) is
    put in ``tmp_path`` too, so a run leaves nothing behind in the user's folders.
    """
    before = sorted(p.name for p in NOTEBOOKS.iterdir())
    copy = tmp_path / path.name
    shutil.copy2(path, copy)
    nb = nbformat.read(copy, as_version=4)
    client = _Client(nb, kernel_name=kernel, timeout=CELL_TIMEOUT,
                     resources={"metadata": {"path": str(tmp_path)}})
    failure = None
    try:
        with mock.patch.dict(os.environ, {"JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}):
            client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        failure = _failure(nb, path.name, e)
    if failure is not None:  # outside the except: only the failing cell, not nbclient's dump
        pytest.fail(failure, pytrace=False)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert code_cells and all(c.execution_count is not None for c in code_cells), \
        f"{path.name}: not every code cell ran"
    # a cell tagged "figures" says it shows figures: its outputs must hold them (rep.plot()
    # once showed "[<Figure size ...>, ...]" text where notebook 08 said it drew them)
    blank = [i for i, c in enumerate(nb.cells) if "figures" in c.metadata.get("tags", [])
             and not any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert not blank, f"{path.name}: cells {blank} are tagged 'figures' and show no image"
    assert sorted(p.name for p in NOTEBOOKS.iterdir()) == before, \
        f"{path.name} wrote into {NOTEBOOKS} instead of its working directory"


@pytest.mark.parametrize("path", SHARES[0], ids=[p.name for p in SHARES[0]])
def test_notebook_runs(path: Path, python3_kernel: str, tmp_path: Path) -> None:
    run_notebook(path, python3_kernel, tmp_path)


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_notebook_is_stored_clean(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} have outputs or execution counts; "
                       "clear them before committing (jupyter nbconvert --clear-output "
                       "--inplace)")
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL
