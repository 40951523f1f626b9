"""The ncnn panel: convert through pnnx, run, fp32 and fp16 against torch."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ...artifact.workspace import Workspace
from ...errors import InputError
from ...stages.ncnn import to_ncnn
from ..code import Code, call
from ..html import artifact_html, esc
from .base import StagePanel, comma_names


# -- ncnn ----------------------------------------------------------------------------------
class NcnnPanel(StagePanel):
    """pnnx -> ncnn: from the module or from the ONNX model; fp16, optlevel, moduleop."""

    stage, title, var = "ncnn", "5. Convert to ncnn", "nc"

    def __init__(self, model: Any = None, inputs: Any = None, *, source: Any = None,
                 workspace: Workspace | str | None = None, from_: str | None = None,
                 fp16: bool = False, optlevel: int = 2, moduleop: str = "",
                 timeout: float = 600.0) -> None:
        self.model = model
        self.inputs = inputs
        self._init = dict(from_=from_ or ("module" if model is not None else "onnx"), fp16=fp16,
                          optlevel=optlevel, moduleop=moduleop, timeout=timeout)
        super().__init__(workspace=workspace)
        self.source = source

    @property
    def needs_model(self) -> bool:
        return self.from_.value == "module"

    def _controls(self) -> list[Any]:
        i = self._init
        options = [("the module (pnnx traces it)", "module"),
                   ("the ONNX model (previous stage)", "onnx")]
        self.from_ = widgets.Dropdown(options=options, value=i["from_"], description="from")
        self.fp16 = widgets.Checkbox(value=i["fp16"], description="fp16 weights", indent=False)
        self.optlevel = widgets.Dropdown(options=[0, 1, 2], value=i["optlevel"],
                                         description="optlevel")
        self.moduleop = widgets.Text(value=i["moduleop"], description="moduleop",
                                     placeholder="Focus, MyBlock")
        self.timeout = widgets.FloatText(value=i["timeout"], description="timeout s")
        return [widgets.HBox([self.from_, self.fp16, self.optlevel]),
                widgets.HBox([self.moduleop, self.timeout])]

    def settings(self) -> dict[str, Any]:
        return {"fp16": self.fp16.value, "optlevel": self.optlevel.value,
                "moduleop": comma_names(self.moduleop.value) or [], "timeout": self.timeout.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        if self.from_.value == "module":
            if self.model is None:
                raise InputError("ncnn from the module needs the model and inputs",
                                 "NcnnPanel(model, inputs) or choose from: the ONNX model")
            return to_ncnn(self.model, self.inputs, workspace=self._ws(), progress=self._on_step,
                           **settings)
        if self.source is None:
            raise InputError("ncnn from ONNX has no ONNX model yet",
                             "run export first, or choose from: the module")
        return to_ncnn(self.source, progress=self._on_step, **settings)

    def _chain(self) -> tuple[list[str], bool]:
        if self.from_.value == "module":  # the source panels are not involved
            try:
                settings = self.settings()
            except InputError as e:
                return [f"# settings not readable: {e.message}"], True
            return [self._ws_line(), *self._body(settings, None)], True
        return super()._chain()

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        if self.from_.value == "module":
            return [call(self.var, "wb.to_ncnn", ["model", "inputs"],
                         {"workspace": Code("ws"), **settings})]
        return [call(self.var, "wb.to_ncnn", [source_var or "src"], settings)]

    def _render(self, result: Any) -> None:
        pnnx = result.parent
        self.result_html.value = artifact_html(result) + (
            f"<details><summary>pnnx graph {esc(pnnx.id)}</summary><pre>"
            f"{esc(pnnx.graph.text())}</pre></details>" if pnnx is not None else "")
        self._show_preview(result)
