"""The export panel and the custom-ops panel (what export lacks, registered)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ...artifact import Artifact, Workspace
from ...errors import InputError
from ..code import Code, call
from .base import StagePanel, _esc, _names, _widgets, artifact_html


# -- export --------------------------------------------------------------------------------
class ExportPanel(StagePanel):
    """torch -> ONNX: exporter, opset, names, dynamic axes, tolerance."""

    stage, title, var = "export", "1. Export to ONNX", "onx"

    def __init__(self, model: Any, inputs: Any, *, workspace: Workspace | str | None = None,
                 exporter: str = "torchscript", opset: int = 17,
                 input_names: list[str] | None = None, output_names: list[str] | None = None,
                 dynamic_axes: dict[str, Any] | None = None, atol: float = 1e-4,
                 rtol: float = 1e-3) -> None:
        from ...inputs import as_tensor_tuple

        self.model = model
        self.inputs = inputs
        self._shapes = [tuple(t.shape) for t in as_tensor_tuple(inputs)]
        self._error_listeners: list[Callable[[StagePanel, BaseException], None]] = []
        self._init = dict(exporter=exporter, opset=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes or {},
                          atol=atol, rtol=rtol)
        super().__init__(workspace=workspace)

    @property
    def needs_model(self) -> bool:
        return True

    def _controls(self) -> list[Any]:
        w = _widgets()
        i = self._init
        self.exporter = w.Dropdown(options=["torchscript", "dynamo"], value=i["exporter"],
                                   description="exporter")
        self.opset = w.IntText(value=i["opset"], description="opset")
        names = i["input_names"] or [f"input{k}" if len(self._shapes) > 1 else "input"
                                     for k in range(len(self._shapes))]
        self.input_names = w.Text(value=", ".join(names), description="input names",
                                  style={"description_width": "initial"})
        self.output_names = w.Text(value=", ".join(i["output_names"] or ["output"]),
                                   description="output names",
                                   style={"description_width": "initial"})
        self.atol = w.FloatText(value=i["atol"], description="atol")
        self.rtol = w.FloatText(value=i["rtol"], description="rtol")
        self.axes_rows = self._axes_editor(names, i["dynamic_axes"])
        axes_box = w.VBox([w.HTML("<b>dynamic axes</b> (tick an axis to let it vary; the "
                                  "text names the dimension)"), *self.axes_rows])
        return [w.HBox([self.exporter, self.opset]), w.HBox([self.input_names,
                                                             self.output_names]),
                w.HBox([self.atol, self.rtol]), axes_box]

    def _watched(self) -> list[Any]:
        axes = [c for row in self.axes_rows for pair in row.children[1:]
                for c in pair.children]
        return [self.exporter, self.opset, self.input_names, self.output_names, self.atol,
                self.rtol, *axes]

    def _axes_editor(self, names: list[str], given: dict[str, Any]) -> list[Any]:
        """One row per input: a checkbox and a dimension name per axis of its example shape."""
        w = _widgets()
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
                box = w.Checkbox(value=axis in declared, description=f"axis {axis} ({size})",
                                 indent=False, layout=w.Layout(width="110px"))
                dim = w.Text(value=str(declared.get(axis) or default),
                             layout=w.Layout(width="90px"))
                pairs.append((box, dim))
            self.axes.append(pairs)
            rows.append(w.HBox([w.HTML(f"<code>{_esc(name)}</code> {_esc(list(shape))}",
                                       layout=w.Layout(width="160px"))]
                               + [w.HBox([b, d]) for b, d in pairs]))
        return rows

    def settings(self) -> dict[str, Any]:
        input_names = _names(self.input_names.value)
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
        return {"exporter": self.exporter.value, "opset": self.opset.value,
                "input_names": input_names, "output_names": _names(self.output_names.value),
                "dynamic_axes": axes or None, "atol": self.atol.value, "rtol": self.rtol.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        from ...stages.export import export

        return export(self.model, self.inputs, workspace=self._ws(), **settings)

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return [call(self.var, "wb.export", ["model", "inputs"],
                     {"workspace": Code("ws"), **settings})]

    def _on_error(self, e: BaseException) -> None:
        for fn in self._error_listeners:
            fn(self, e)

    def on_error(self, fn: Callable[[StagePanel, BaseException], None]) -> None:
        """Call ``fn(panel, error)`` when export fails (the custom-ops panel reads the op)."""
        self._error_listeners.append(fn)


# -- custom ops ----------------------------------------------------------------------------
class CustomOpsPanel(StagePanel):
    """Register a symbolic for an ATen op the exporter cannot convert, then export again."""

    stage, title, var = "custom_ops", "2. Custom ops", "symbolic"

    def __init__(self, *, workspace: Workspace | str | None = None, op: str = "",
                 onnx_op: str = "", opset: int = 17, export_panel: ExportPanel | None = None
                 ) -> None:
        self._init = dict(op=op, onnx_op=onnx_op, opset=opset)
        self.export_panel = export_panel
        super().__init__(workspace=workspace)
        self.netron_button.layout.display = "none"
        if export_panel is not None:
            export_panel.on_error(self._suggest)

    def _controls(self) -> list[Any]:
        w = _widgets()
        self.op = w.Text(value=self._init["op"], description="ATen op",
                         placeholder="aten::asinh")
        self.onnx_op = w.Text(value=self._init["onnx_op"], description="ONNX op",
                              placeholder="Asinh")
        self.opset = w.IntText(value=self._init["opset"], description="opset")
        self.reexport = w.Checkbox(value=True, description="export again after registering",
                                   indent=False)
        self.registered = w.HTML()
        self._show_registered()
        return [w.HTML("A symbolic <code>lambda g, *args: g.op(ONNX op, *args)</code> for "
                       "the ATen op (TorchScript exporter)."),
                w.HBox([self.op, self.onnx_op, self.opset]), self.reexport, self.registered]

    def _watched(self) -> list[Any]:
        return [self.op, self.onnx_op, self.opset]

    def _show_registered(self) -> None:
        """What is registered in this kernel: symbolics (with opsets) and @wb.custom_op ops."""
        from ...customops import registered_ops, registered_symbolics

        syms = ", ".join(f"{n} (opset {', '.join(map(str, o))})"
                         for n, o in registered_symbolics().items()) or "none"
        ops = ", ".join(registered_ops()) or "none"
        self.registered.value = (f"<div class='wb-registered' style='font-size:12px'>"
                                 f"registered symbolics: {_esc(syms)}<br>"
                                 f"custom ops (@wb.custom_op): {_esc(ops)}</div>")

    def _suggest(self, _panel: StagePanel, e: BaseException) -> None:
        """Fill the ATen op from an export error that names one."""
        m = re.search(r"aten::\w+", str(e))
        if m and not self.op.value:
            self.op.value = m.group(0)
            op = re.search(r"g\.op\([\"'](\w+)[\"']", getattr(e, "hint", "") or "")
            if op and not self.onnx_op.value:  # the registration the export error suggests
                self.onnx_op.value = op.group(1)
            opset = re.search(r"opset=(\d+)", getattr(e, "hint", "") or "")
            if opset:
                self.opset.value = int(opset.group(1))
            self.status.value = (f"<span>export failed on <code>{_esc(m.group(0))}</code>: "
                                 "register a symbolic here</span>")

    def settings(self) -> dict[str, Any]:
        op, onnx_op = self.op.value.strip(), self.onnx_op.value.strip()
        if not re.fullmatch(r"\w+::\w+(\.\w+)?", op):
            raise InputError(f"ATen op {op!r} is not a qualified name like 'aten::asinh'",
                             "write namespace::name, as in the export error")
        if not re.fullmatch(r"[A-Z]\w*", onnx_op):
            raise InputError(f"ONNX op {onnx_op!r} is not an ONNX op type like 'Asinh'",
                             "an ONNX operator name starts with a capital letter")
        return {"name": op, "onnx_op": onnx_op, "opset": self.opset.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        from ...customops import register_symbolic

        onnx_op = settings["onnx_op"]
        register_symbolic(settings["name"], lambda g, *args: g.op(onnx_op, *args),
                          opset=settings["opset"])
        if self.reexport.value and self.export_panel is not None:
            art = self.export_panel.run()
            if self.export_panel.error is not None:
                raise self.export_panel.error
            return art
        return settings

    def _render(self, result: Any) -> None:
        self._show_registered()
        if isinstance(result, Artifact):
            self.result_html.value = ("<div>registered; export ran again:</div>"
                                      + artifact_html(result))
        else:
            self.result_html.value = (f"<div class='wb-summary'>registered a symbolic for "
                                      f"<code>{_esc(result['name'])}</code></div>")

    def _chain(self) -> tuple[list[str], bool]:
        try:
            s = self.settings()
        except InputError as e:
            return [f"# settings not readable: {e.message}"], False
        return [f"wb.register_symbolic({s['name']!r}, lambda g, *args: "
                f"g.op({s['onnx_op']!r}, *args), opset={s['opset']})"], False

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return []
