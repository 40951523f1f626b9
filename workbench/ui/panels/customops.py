"""The custom-ops panel: what export lacks, registered, then export again.

A symbolic for an ATen op the exporter cannot convert (``wb.register_symbolic``), or an op
of your own declared once (``@wb.custom_op``); an export error that names the op fills it in.
"""

from __future__ import annotations

import re
from typing import Any

import ipywidgets as widgets

import workbench as wb  # the package the user's declaration sees as ``wb``

from ...artifact.record import Artifact
from ...artifact.workspace import Workspace
from ...customops import register_symbolic, registered_ops, registered_symbolics
from ...errors import InputError
from ...inputs import missing_torch_op
from ..html import artifact_html, esc
from .base import StagePanel
from .export import ExportPanel

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
        i = self._init
        self.kind = widgets.ToggleButtons(
            options=[("wb.register_symbolic (an ATen op)", SYMBOLIC),
                     ("@wb.custom_op (an op of your own)", CUSTOM_OP)], value=i["kind"],
            style={"button_width": "250px"})
        self.op = widgets.Text(value=i["op"], description="op", placeholder="aten::asinh")
        self.onnx_op = widgets.Text(value=i["onnx_op"], description="ONNX op",
                                    placeholder="Asinh")
        self.opset = widgets.IntText(value=i["opset"], description="opset")
        self.declaration = widgets.Textarea(
            value=i["declaration"] or custom_op_template(i["op"] or "mylib::my_op"),
            layout=widgets.Layout(width="640px", height="140px"))
        self.declaration.add_class("wb-custom-op-code")
        self.reexport = widgets.Checkbox(value=True, description="export again after registering",
                                         indent=False)
        self.registered = widgets.HTML()
        self._show_registered()
        self.symbolic_box = widgets.VBox([
            widgets.HTML("A symbolic <code>lambda g, *args: g.op(ONNX op, *args)</code> for the "
                         "ATen op (one TorchScript-style function serves both exporters)."),
            widgets.HBox([self.onnx_op, self.opset])])
        self.custom_box = widgets.VBox([
            widgets.HTML("The op's declaration, run in this kernel (<code>wb</code> and "
                         "<code>torch</code> are imported): its torch code is the reference "
                         "and the kernel ONNX Runtime and ncnn run; it exports as a node of "
                         "the op's domain."),
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
        syms = ", ".join(f"{n} (opset {', '.join(map(str, o))})"
                         for n, o in registered_symbolics().items()) or "none"
        ops = ", ".join(registered_ops()) or "none"
        self.registered.value = (f"<div class='wb-registered' style='font-size:12px'>"
                                 f"registered symbolics: {esc(syms)}<br>"
                                 f"custom ops (@wb.custom_op): {esc(ops)}</div>")

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
            self.status.value = (f"<span>export failed on <code>{esc(name)}</code>: declare "
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
        self.status.value = (f"<span>export failed on <code>{esc(m.group(0))}</code>: "
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
        if settings["kind"] == CUSTOM_OP:
            import torch  # heavy: loaded only when an op is declared

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
                                      f"<code>{esc(result['name'])}</code></div>")

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
