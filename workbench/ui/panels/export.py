"""The export panel: torch -> ONNX, with the exporter, opset, names and dynamic axes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from ...artifact.workspace import Workspace
from ...errors import InputError
from ...inputs import as_tensor_tuple
from ...stages.export import export
from ..code import Code, call
from ..html import esc
from .base import StagePanel, comma_names


class ExportPanel(StagePanel):
    """torch -> ONNX: exporter, opset, names, dynamic axes, tolerance."""

    stage, title, var = "export", "1. Export to ONNX", "onx"

    def __init__(self, model: Any, inputs: Any, *, workspace: Workspace | str | None = None,
                 exporter: str = "torchscript", opset: int = 17,
                 input_names: list[str] | None = None, output_names: list[str] | None = None,
                 dynamic_axes: dict[str, Any] | None = None, atol: float = 1e-4,
                 rtol: float = 1e-3, backend: str = "onnxruntime", rewrite: bool = True) -> None:
        self.model = model
        self.inputs = inputs
        self._shapes = [tuple(t.shape) for t in as_tensor_tuple(inputs)]
        self._error_listeners: list[Callable[[StagePanel, BaseException], None]] = []
        self._init = dict(exporter=exporter, opset=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes or {},
                          atol=atol, rtol=rtol, backend=backend, rewrite=rewrite)
        super().__init__(workspace=workspace)

    @property
    def needs_model(self) -> bool:
        return True

    def _controls(self) -> list[Any]:
        i = self._init
        self.exporter = widgets.Dropdown(options=["torchscript", "dynamo"], value=i["exporter"],
                                         description="exporter")
        self.opset = widgets.IntText(value=i["opset"], description="opset")
        names = i["input_names"] or [f"input{k}" if len(self._shapes) > 1 else "input"
                                     for k in range(len(self._shapes))]
        self.input_names = widgets.Text(value=", ".join(names), description="input names",
                                        style={"description_width": "initial"})
        self.output_names = widgets.Text(value=", ".join(i["output_names"] or ["output"]),
                                         description="output names",
                                         style={"description_width": "initial"})
        # the rewriters registered for this backend apply during the export (Rewriters tab)
        self.backend = widgets.Dropdown(options=["onnxruntime", "ncnn"], value=i["backend"],
                                        description="for backend",
                                        style={"description_width": "initial"})
        self.rewrite = widgets.Checkbox(value=i["rewrite"], indent=False,
                                        description="apply rewriters")
        self.atol = widgets.FloatText(value=i["atol"], description="atol")
        self.rtol = widgets.FloatText(value=i["rtol"], description="rtol")
        self.axes_rows = self._axes_editor(names, i["dynamic_axes"])
        axes_box = widgets.VBox([widgets.HTML("<b>dynamic axes</b> (tick an axis to let it vary; "
                                              "the text names the dimension)"),
                                 *self.axes_rows])
        return [widgets.HBox([self.exporter, self.opset, self.backend, self.rewrite]),
                widgets.HBox([self.input_names, self.output_names]),
                widgets.HBox([self.atol, self.rtol]), axes_box]

    def _watched(self) -> list[Any]:
        axes = [c for row in self.axes_rows for pair in row.children[1:]
                for c in pair.children]
        return [self.exporter, self.opset, self.input_names, self.output_names, self.atol,
                self.rtol, self.backend, self.rewrite, *axes]

    def _axes_editor(self, names: list[str], given: dict[str, Any]) -> list[Any]:
        """One row per input: a checkbox and a dimension name per axis of its example shape."""
        rows = []
        self.axes: list[list[tuple[Any, Any]]] = []
        for k, shape in enumerate(self._shapes):
            name = names[k] if k < len(names) else f"input{k}"
            declared = given.get(name, {})
            if isinstance(declared, (list, tuple)):
                declared = {a: None for a in declared}
            pairs = []
            for axis, size in enumerate(shape):
                default = ("batch" if axis == 0 else
                           {2: "height", 3: "width"}.get(axis, f"d{axis}") if len(shape) == 4
                           else f"d{axis}")
                box = widgets.Checkbox(value=axis in declared, description=f"axis {axis} ({size})",
                                       indent=False, layout=widgets.Layout(width="110px"))
                dim = widgets.Text(value=str(declared.get(axis) or default),
                                   layout=widgets.Layout(width="90px"))
                pairs.append((box, dim))
            self.axes.append(pairs)
            rows.append(widgets.HBox([widgets.HTML(f"<code>{esc(name)}</code> {esc(list(shape))}",
                                                   layout=widgets.Layout(width="160px"))]
                                     + [widgets.HBox([b, d]) for b, d in pairs]))
        return rows

    def settings(self) -> dict[str, Any]:
        input_names = comma_names(self.input_names.value)
        axes: dict[str, dict[int, str]] = {}
        for k, pairs in enumerate(self.axes):
            chosen = {a: d.value.strip() for a, (b, d) in enumerate(pairs) if b.value}
            if not chosen:
                continue
            if not input_names or k >= len(input_names):
                raise InputError(f"dynamic axes are ticked for input {k}, which has no name",
                                 "give every input a name in 'input names' (comma-separated)")
            for a, dim in chosen.items():
                if not dim.isidentifier():
                    raise InputError(f"dimension name {dim!r} (input {input_names[k]!r}, axis "
                                     f"{a}) is not an identifier", "use a name like batch, h, w")
            axes[input_names[k]] = chosen
        out = {"exporter": self.exporter.value, "opset": self.opset.value,
               "input_names": input_names, "output_names": comma_names(self.output_names.value),
               "dynamic_axes": axes or None, "atol": self.atol.value, "rtol": self.rtol.value}
        if self.backend.value != "onnxruntime":  # the defaults stay out of Show code
            out["backend"] = self.backend.value
        if not self.rewrite.value:
            out["rewrite"] = False
        return out

    def _render(self, result: Any) -> None:
        super()._render(result)
        self.result_html.value += rewrites_html(result)

    def _execute(self, settings: dict[str, Any]) -> Any:
        return export(self.model, self.inputs, workspace=self._ws(), progress=self._on_step,
                      **settings)

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return [call(self.var, "wb.export", ["model", "inputs"],
                     {"workspace": Code("ws"), **settings})]

    def _on_error(self, e: BaseException) -> None:
        for fn in self._error_listeners:
            fn(self, e)

    def on_error(self, fn: Callable[[StagePanel, BaseException], None]) -> None:
        """Call ``fn(panel, error)`` when export fails (the custom-ops panel reads the op)."""
        self._error_listeners.append(fn)


def rewrites_html(art: Any) -> str:
    """The rewriters that fired in this export and how often (the Rewriters tab lists those
    that did not)."""
    fired = getattr(art, "rewrites", None) or []
    if not fired:
        return (f"<div class='wb-rewrites' style='color:#777'>rewriters fired: none (exported "
                f"for {esc(art.params.get('backend', 'onnxruntime'))})</div>")
    items = "".join(f"<li><code>{esc(r.name)}</code> {esc(r.kind)} {esc(r.target)}"
                    + ("" if r.calls is None else f" &times;{r.calls}") + "</li>"
                    for r in fired)
    return f"<div class='wb-rewrites'>rewriters fired:<ul>{items}</ul></div>"
