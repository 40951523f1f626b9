"""``wb.ui.sweep_view(ws)``: a sweep's coverage matrix in the notebook, filling in while the
sweep runs (in another process, a thread or on a cluster): it re-reads the sweep's SQLite
store every ``interval`` seconds until every cell is stored, then stops by itself.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from ..errors import WorkspaceError
from ..sweeps.db import DB_NAME, SweepDB
from ..sweeps.report import matrix_html


class SweepView(widgets.VBox):
    """The matrix (coloured by status) and a line of counts; ``refresh()`` reads it once,
    ``stop()`` ends the polling."""

    def __init__(self, workspace: Any, interval: float = 1.0, watch: bool = True) -> None:
        path = getattr(workspace, "workspace", None) or getattr(workspace, "path", workspace)
        self.folder = Path(os.fspath(path)).absolute()
        self.interval = interval
        self.status = widgets.HTML()
        self.matrix = widgets.HTML()
        super().__init__([self.status, self.matrix])
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.finished = self.refresh()
        if watch and not self.finished:
            self._thread = threading.Thread(target=self._watch, name="wb-sweep-view",
                                            daemon=True)
            self._thread.start()

    def refresh(self) -> bool:
        """Read the store and redraw; True when every cell of the sweep is stored."""
        if not (self.folder / DB_NAME).is_file():
            self.status.value = f"waiting for a sweep in {self.folder} …"
            return False
        try:
            with SweepDB(self.folder, readonly=True) as db:
                cells = db.cells()
        except WorkspaceError as e:  # being created this instant, or not a sweep's store
            self.status.value = f"cannot read the sweep yet: {e.message}"
            return False
        done = [c for c in cells if c.done]
        failed = [c for c in cells if c.failed]
        self.status.value = (f"<b>{len(done)} of {len(cells)}</b> cells stored: "
                             f"{len(done) - len(failed)} ok, {len(failed)} failed")
        self.matrix.value = matrix_html(cells)
        return bool(cells) and len(done) == len(cells)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            if self.refresh():
                self.finished = True
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the sweep is stored (or ``timeout``); True when it is."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.finished


def sweep_view(workspace: Any, interval: float = 1.0) -> SweepView:
    """The matrix of the sweep in ``workspace`` (a folder, or a SweepResult), live."""
    return SweepView(workspace, interval=interval)

