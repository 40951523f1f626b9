"""What a panel's "Show code" writes: the workspace line, how the panel's input is obtained
(from the workspace, or the calls of the panels before it), then the panel's own call.

The pieces of one call (``call``, ``Code``, ``program``) are in ``ui.code``; this is how a
panel strings them together, so the code always runs on its own given ``model`` and
``inputs``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...artifact.record import Artifact
from ...artifact.rewrites import code_lines
from ...artifact.workspace import Workspace
from ...errors import InputError
from ..code import program


def workspace_line(ws: Workspace, given: str | None) -> str:
    """``ws = wb.Workspace(path)`` with the path as the user gave it; for a Workspace
    object, relative to the working directory when it lies below it."""
    if given is None or Path(given).absolute() != ws.path:
        try:
            given = os.path.relpath(ws.path) if ws.path.is_relative_to(Path.cwd()) \
                else str(ws.path)
        except (OSError, ValueError):  # no working directory, another drive
            given = str(ws.path)
    return f"ws = wb.Workspace({given!r})"


class PanelCode:
    """The code half of a stage panel: ``code()`` and the chains it is made of.

    The panel gives ``stage``, ``var``, ``source``, ``upstream``, ``workspace_given``,
    ``needs_model``, ``settings()``, ``_body(settings, source_var)`` and ``_ws()``; a panel
    whose input is obtained otherwise (compare's candidates, ncnn from the module, a
    registration) overrides ``_chain``.
    """

    stage: str
    var: str
    source: Any
    upstream: PanelCode | None
    workspace_given: str | None
    needs_model: bool
    settings: Callable[[], dict[str, Any]]
    _body: Callable[[dict[str, Any], str | None], list[str]]
    _ws: Callable[[], Workspace]

    def _ws_line(self) -> str:
        return workspace_line(self._ws(), self.workspace_given)

    def code(self) -> str:
        """The engine calls for the current settings, ready to paste (runs given model, inputs)."""
        body, needs_model = self._chain()
        # the rewriters that fired in this panel's run, registered before the call again
        body[:0] = code_lines(getattr(getattr(self, "result", None), "rewrites", None) or [])
        if self.stage not in ("custom_ops", "compare"):
            body.append(f"print({self.var}.summary())")
        return program(body, needs_model)

    def _chain(self) -> tuple[list[str], bool]:
        """This panel's lines, preceded by how its source is obtained."""
        lines = [self._ws_line()]
        needs_model = self.needs_model
        source_var = None
        if isinstance(self.source, Artifact):
            source_var = "src"
            lines.append(f"src = ws.get({self.source.id!r})")
        elif self.upstream is not None:
            up, up_model = self.upstream._chain()
            lines = up  # starts with the same ws line
            needs_model = needs_model or up_model
            source_var = self.upstream.var
        try:
            settings = self.settings()
        except InputError as e:
            return lines + [f"# settings not readable: {e.message}"], needs_model
        return lines + self._body(settings, source_var), needs_model

    def _chain_fresh(self) -> tuple[list[str], bool]:
        """This panel's lines after every upstream panel's, from the model (the whole chain)."""
        settings = self.settings()
        if self.upstream is None:
            return [self._ws_line(),
                    *self._body(settings, None)], self.needs_model
        lines, needs_model = self.upstream._chain_fresh()
        return lines + self._body(settings, self.upstream.var), needs_model or self.needs_model
