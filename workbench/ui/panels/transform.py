"""The simplify and raise panels."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ...artifact.workspace import Workspace
from ...errors import InputError
from ...rules import names as rule_names
from ...stages.raising import RaiseReport, raise_ops
from ...stages.simplify import simplify
from ..code import call
from ..html import esc
from .base import StagePanel


# -- simplify ------------------------------------------------------------------------------
class SimplifyPanel(StagePanel):
    """Constant folding and glue removal: backend, tolerance."""

    stage, title, var = "simplify", "3. Simplify", "sim"

    def __init__(self, source: Any = None, *, workspace: Workspace | str | None = None,
                 backend: str = "onnxslim", atol: float = 1e-4, rtol: float = 1e-3) -> None:
        self._init = dict(backend=backend, atol=atol, rtol=rtol)
        super().__init__(workspace=workspace)
        self.source = source

    def _controls(self) -> list[Any]:
        self.backend = widgets.Dropdown(options=["onnxslim", "onnxsim", "onnxscript"],
                                        value=self._init["backend"], description="backend")
        self.atol = widgets.FloatText(value=self._init["atol"], description="atol")
        self.rtol = widgets.FloatText(value=self._init["rtol"], description="rtol")
        return [widgets.HBox([self.backend, self.atol, self.rtol])]

    def settings(self) -> dict[str, Any]:
        return {"backend": self.backend.value, "atol": self.atol.value, "rtol": self.rtol.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        if self.source is None:
            raise InputError("simplify has no ONNX model to work on yet",
                             "run the export panel first (or pass source= an artifact)")
        return simplify(self.source, progress=self._on_step, **settings)

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return [call(self.var, "wb.simplify", [source_var or "src"], settings)]


# -- raise ---------------------------------------------------------------------------------
class RaisePanel(StagePanel):
    """Fold lowered subgraphs back into high-level ops: rules, target."""

    stage, title, var = "raise", "4. Raise to high-level ops", "hi"
    tab = "Raise ops"

    def __init__(self, source: Any = None, *, workspace: Workspace | str | None = None,
                 rules: list[str] | None = None, target: str = "standard") -> None:
        self._init = dict(rules=rules, target=target)
        super().__init__(workspace=workspace)
        self.source = source

    def _controls(self) -> list[Any]:
        try:
            known = rule_names()
        except Exception:  # a rule module that cannot list itself: no rule to pick
            known = []
        chosen = self._init["rules"]
        self.rules = widgets.SelectMultiple(options=known, value=tuple(chosen or known),
                                            description="rules", rows=min(8, max(3, len(known))))
        self.target = widgets.Dropdown(options=["standard", "functions"],
                                       value=self._init["target"], description="target")
        return [widgets.HBox([self.rules, self.target])]

    def settings(self) -> dict[str, Any]:
        chosen = list(self.rules.value)
        every = list(self.rules.options)
        return {"rules": None if chosen == every else chosen, "target": self.target.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        if self.source is None:
            raise InputError("raise has no ONNX model to work on yet",
                             "run export (and simplify) first, or pass source= an artifact")
        if settings["rules"] == []:
            raise InputError("no raising rule is selected", "select at least one rule")
        return raise_ops(self.source, progress=self._on_step, **settings)

    def _render(self, result: Any) -> None:
        super()._render(result)
        try:
            report = RaiseReport.of(result)
            text = str(report)
        except Exception:
            return
        self.result_html.value += (f"<details><summary>raising report</summary><pre>"
                                   f"{esc(text)}</pre></details>")

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return [call(self.var, "wb.raise_ops", [source_var or "src"], settings)]
