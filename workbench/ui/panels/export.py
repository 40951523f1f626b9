"""The export panel and the custom-ops panel (what export lacks, registered)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ...artifact import Artifact, Workspace
from ...errors import InputError
from ...inputs import missing_torch_op
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
SYMBOLIC, CUSTOM_OP = "symbolic", "custom_op"


def custom_op_template(name: str) -> str:
    """A ``@wb.custom_op`` declaration of ``name`` to edit: the torch code is the reference
    and the kernel ONNX Runtime and ncnn run until native ones exist."""
    short = name.split("::", 1)[-1].split(".")[0] or "my_op"
    return (f"@wb.custom_op({name!r}, mutates_args=())\n"
            f"def {short}(x: torch.Tensor) -> torch.Tensor:\n"
            "    # the op in torch (annotate every argument): also what ONNX Runtime and ncnn\n"
            "    # run, until ort= / ncnn= kernels are given\n"
            "    return x.clone()\n")


class CustomOpsPanel(StagePanel):
    """What export lacks, registered, then export again: a symbolic for an ATen op the
    exporter cannot convert (``wb.register_symbolic``), or an op of your own declared once
    for torch, both exporters, ONNX Runtime and ncnn (``@wb.custom_op``)."""

    stage, title, var = "custom_ops", "2. Custom ops", "symbolic"

    def __init__(self, *, workspace: Workspace | str | None = None, op: str = "",
                 onnx_op: str = "", opset: int = 17, export_panel: ExportPanel | None = None,
                 kind: str = SYMBOLIC, declaration: str = "") -> None:
        if kind not in (SYMBOLIC, CUSTOM_OP):
            raise InputError(f"kind={kind!r} is not {SYMBOLIC!r} or {CUSTOM_OP!r}",
                             "'symbolic': wb.register_symbolic for an ATen op; 'custom_op': "
                             "@wb.custom_op for an op of your own")
        self._init = dict(op=op, onnx_op=onnx_op, opset=opset, kind=kind,
                          declaration=declaration)
        self.export_panel = export_panel
        super().__init__(workspace=workspace)
        self.netron_button.layout.display = "none"
        if export_panel is not None:
            export_panel.on_error(self._suggest)

    def _controls(self) -> list[Any]:
        w = _widgets()
        i = self._init
        self.kind = w.ToggleButtons(
            options=[("wb.register_symbolic (an ATen op)", SYMBOLIC),
                     ("@wb.custom_op (an op of your own)", CUSTOM_OP)], value=i["kind"],
            style={"button_width": "250px"})
        self.op = w.Text(value=i["op"], description="op", placeholder="aten::asinh")
        self.onnx_op = w.Text(value=i["onnx_op"], description="ONNX op",
                              placeholder="Asinh")
        self.opset = w.IntText(value=i["opset"], description="opset")
        self.declaration = w.Textarea(
            value=i["declaration"] or custom_op_template(i["op"] or "mylib::my_op"),
            layout=w.Layout(width="640px", height="140px"))
        self.declaration.add_class("wb-custom-op-code")
        self.reexport = w.Checkbox(value=True, description="export again after registering",
                                   indent=False)
        self.registered = w.HTML()
        self._show_registered()
        self.symbolic_box = w.VBox([
            w.HTML("A symbolic <code>lambda g, *args: g.op(ONNX op, *args)</code> for the ATen "
                   "op (one TorchScript-style function serves both exporters)."),
            w.HBox([self.onnx_op, self.opset])])
        self.custom_box = w.VBox([
            w.HTML("The op's declaration, run in this kernel (<code>wb</code> and "
                   "<code>torch</code> are imported): its torch code is the reference and the "
                   "kernel ONNX Runtime and ncnn run; it exports as a node of the op's domain."),
            self.declaration])
        self.kind.observe(self._kind_changed, names="value")
        self._kind_changed()
        return [self.kind, self.op, self.symbolic_box, self.custom_box, self.reexport,
                self.registered]

    def _watched(self) -> list[Any]:
        return [self.kind, self.op, self.onnx_op, self.opset, self.declaration]

    def _kind_changed(self, _change: Any = None) -> None:
        custom = self.kind.value == CUSTOM_OP
        self.symbolic_box.layout.display = "none" if custom else ""
        self.custom_box.layout.display = "" if custom else "none"
        self.op.placeholder = "mylib::my_op" if custom else "aten::asinh"

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
        """Fill the op from an export error that names one: an ATen op wants a symbolic, an op
        of another namespace (``mylib::frob``) a ``@wb.custom_op`` declaration."""
        if self.op.value:
            return
        text = f"{e}\n{getattr(e, 'hint', '') or ''}"
        m = re.search(r"\baten::\w+", text)
        if m is None:  # an op of another namespace, or one torch.ops does not have yet
            other = re.search(r"\b(?!aten::|prim::|onnx::)([a-z_]\w*)::(\w+)", text)
            name = missing_torch_op(e) or (other and f"{other.group(1)}::{other.group(2)}")
            if not name:
                return
            self.kind.value = CUSTOM_OP
            self.op.value = name
            self.declaration.value = custom_op_template(name)
            self.status.value = (f"<span>export failed on <code>{_esc(name)}</code>: declare "
                                 "it here with @wb.custom_op</span>")
            return
        self.kind.value = SYMBOLIC
        self.op.value = m.group(0)
        hint = getattr(e, "hint", "") or ""
        op = re.search(r"g\.op\([\"'](\w+)[\"']", hint)
        if op and not self.onnx_op.value:  # the registration the export error suggests
            self.onnx_op.value = op.group(1)
        opset = re.search(r"opset=(\d+)", hint)
        if opset:
            self.opset.value = int(opset.group(1))
        self.status.value = (f"<span>export failed on <code>{_esc(m.group(0))}</code>: "
                             "register a symbolic here</span>")

    def settings(self) -> dict[str, Any]:
        op = self.op.value.strip()
        if not re.fullmatch(r"\w+::\w+(\.\w+)?", op):
            raise InputError(f"op {op!r} is not a qualified name like "
                             f"{'mylib::my_op' if self.kind.value == CUSTOM_OP else 'aten::asinh'!r}",
                             "write namespace::name, as in the export error")
        if self.kind.value == CUSTOM_OP:
            code = self.declaration.value
            try:
                compile(code, "<custom op declaration>", "exec")
            except SyntaxError as e:
                raise InputError(f"the declaration does not parse: {e.msg} (line {e.lineno})",
                                 "fix the code above; it runs as a notebook cell would"
                                 ) from None
            if op not in code:
                raise InputError(f"the declaration does not name {op!r}",
                                 f"@wb.custom_op({op!r}, mutates_args=()) above the function")
            return {"kind": CUSTOM_OP, "name": op, "code": code}
        onnx_op = self.onnx_op.value.strip()
        if not re.fullmatch(r"[A-Z]\w*", onnx_op):
            raise InputError(f"ONNX op {onnx_op!r} is not an ONNX op type like 'Asinh'",
                             "an ONNX operator name starts with a capital letter")
        return {"kind": SYMBOLIC, "name": op, "onnx_op": onnx_op, "opset": self.opset.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        from ...customops import register_symbolic, registered_ops

        if settings["kind"] == CUSTOM_OP:
            import torch

            import workbench as wb

            namespace = {"wb": wb, "torch": torch, "__name__": "__main__"}
            exec(compile(settings["code"], "<custom op declaration>", "exec"), namespace)
            if settings["name"] not in registered_ops():
                raise InputError(f"the declaration ran but declared no op {settings['name']!r}",
                                 f"decorate the function with @wb.custom_op({settings['name']!r}"
                                 ", mutates_args=())")
        else:
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
            what = ("declared the op" if result["kind"] == CUSTOM_OP
                    else "registered a symbolic for")
            self.result_html.value = (f"<div class='wb-summary'>{what} "
                                      f"<code>{_esc(result['name'])}</code></div>")

    def _chain(self) -> tuple[list[str], bool]:
        try:
            s = self.settings()
        except InputError as e:
            return [f"# settings not readable: {e.message}"], False
        if s["kind"] == CUSTOM_OP:
            return ["import torch", "", s["code"].rstrip("\n")], False
        return [f"wb.register_symbolic({s['name']!r}, lambda g, *args: "
                f"g.op({s['onnx_op']!r}, *args), opset={s['opset']})"], False

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return []
