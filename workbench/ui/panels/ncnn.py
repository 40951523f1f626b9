"""The ncnn panel: convert through pnnx, run, fp32 and fp16 against torch; with a target, the
same check run by ncnn's own ARM build under QEMU user mode (``sweeps.on_target``)."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ...artifact.workspace import Workspace
from ...errors import InputError
from ...stages.ncnn import to_ncnn
from ...stages.ncnn_target import check_target, on_target, target_options
from ..code import Code, call, literal
from ..html import artifact_html, diagnostics_html, esc
from .base import StagePanel, comma_names

# what the target check runs: (label, precisions)
TARGET_PRECISIONS = [("fp32 and fp16", ("fp32", "fp16")), ("fp16", ("fp16",)),
                     ("fp32", ("fp32",)), ("fp16-storage", ("fp16-storage",)),
                     ("bf16", ("bf16",))]


# -- ncnn ----------------------------------------------------------------------------------
class NcnnPanel(StagePanel):
    """pnnx -> ncnn: from the module or from the ONNX model; fp16, optlevel, moduleop; a
    target (None: this machine; an ARM target: the converted model also checked there, by
    ncnn's aarch64 build under QEMU, in ``target_precisions``)."""

    stage, title, var = "ncnn", "5. Convert to ncnn", "nc"

    def __init__(self, model: Any = None, inputs: Any = None, *, source: Any = None,
                 workspace: Workspace | str | None = None, from_: str | None = None,
                 fp16: bool = False, optlevel: int = 2, moduleop: str = "",
                 timeout: float = 600.0, target: str | None = None,
                 target_precisions: tuple[str, ...] | list[str] = ("fp32", "fp16")) -> None:
        self.model = model
        self.inputs = inputs
        self.target_runs: list[Any] = []  # the last run's checks on the target
        if tuple(target_precisions) not in [v for _, v in TARGET_PRECISIONS]:
            raise InputError(f"target_precisions={target_precisions!r} is not one of "
                             f"{[v for _, v in TARGET_PRECISIONS]}", "e.g. ('fp32', 'fp16')")
        self._init = dict(from_=from_ or ("module" if model is not None else "onnx"), fp16=fp16,
                          optlevel=optlevel, moduleop=moduleop, timeout=timeout,
                          target=check_target(target, installed=False),
                          target_precisions=tuple(target_precisions))
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
        # None: this machine's ncnn; an ARM target: labelled by the phone it stands for
        self.target = widgets.Dropdown(options=target_options(), value=i["target"],
                                       description="check on",
                                       layout=widgets.Layout(width="640px"))
        self.target_precisions = widgets.Dropdown(options=TARGET_PRECISIONS,
                                                  value=i["target_precisions"],
                                                  description="in")
        self.target_precisions.layout.display = "" if i["target"] else "none"
        self.target.observe(self._target_changed, names="value")
        return [widgets.HBox([self.from_, self.fp16, self.optlevel]),
                widgets.HBox([self.moduleop, self.timeout]),
                widgets.HBox([self.target, self.target_precisions])]

    def _watched(self) -> list[Any]:
        return [self.from_, self.fp16, self.optlevel, self.moduleop, self.timeout, self.target,
                self.target_precisions]

    def _target_changed(self, change: dict) -> None:
        self.target_precisions.layout.display = "" if change["new"] else "none"

    def target_settings(self) -> dict[str, Any]:
        """Where the converted model is also checked: {"target", "precisions"} (target None:
        this machine's check only, the one to_ncnn runs)."""
        return {"target": self.target.value, "precisions": tuple(self.target_precisions.value)}

    def settings(self) -> dict[str, Any]:
        return {"fp16": self.fp16.value, "optlevel": self.optlevel.value,
                "moduleop": comma_names(self.moduleop.value) or [], "timeout": self.timeout.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        self.target_runs = []
        where = self.target_settings()
        check_target(where["target"])  # an unknown or missing target: said before converting
        if self.from_.value == "module":
            if self.model is None:
                raise InputError("ncnn from the module needs the model and inputs",
                                 "NcnnPanel(model, inputs) or choose from: the ONNX model")
            art = to_ncnn(self.model, self.inputs, workspace=self._ws(), progress=self._on_step,
                          **settings)
        else:
            if self.source is None:
                raise InputError("ncnn from ONNX has no ONNX model yet",
                                 "run export first, or choose from: the module")
            art = to_ncnn(self.source, progress=self._on_step, **settings)
        if where["target"] is not None:
            model, inputs = (self.model, self.inputs) if self.from_.value == "module" else \
                (None, None)
            self.target_runs = on_target(art, where["target"], model, inputs,
                                         precisions=where["precisions"],
                                         progress=self._on_step)
        return art

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
            lines = [call(self.var, "wb.to_ncnn", ["model", "inputs"],
                          {"workspace": Code("ws"), **settings})]
        else:
            lines = [call(self.var, "wb.to_ncnn", [source_var or "src"], settings)]
        return lines + self._target_lines()

    def _target_lines(self) -> list[str]:
        """The check on the target, when one is chosen: ncnn's ARM build under QEMU."""
        where = self.target_settings()
        if where["target"] is None:
            return []
        given = ["model", "inputs"] if self.from_.value == "module" else []
        head = call("runs", "on_target", [self.var, literal(where["target"]), *given],
                    {"precisions": where["precisions"]})
        return ["from workbench.stages.ncnn_target import on_target",
                f"# ncnn's own aarch64 build under QEMU user mode ({where['target']}); "
                "emulated time is not phone time",
                head, "for run in runs:", "    print(run.line())"]

    def _render(self, result: Any) -> None:
        pnnx = result.parent
        self.result_html.value = artifact_html(result) + self._target_html() + (
            f"<details><summary>pnnx graph {esc(pnnx.id)}</summary><pre>"
            f"{esc(pnnx.graph.text())}</pre></details>" if pnnx is not None else "")
        self._show_preview(result)

    def _target_html(self) -> str:
        """Each run on the target: what ran, its error vs torch, the verdict, notes, hint."""
        if not self.target_runs:
            return ""
        rows = []
        for r in self.target_runs:
            colour = "#2e7d32" if r.ok else "#c62828"
            hint = "" if r.ok or not r.hint else \
                f"<div class='wb-hint' style='margin-left:1em'>hint: {esc(r.hint)}</div>"
            rows.append(f"<div class='wb-target-run' data-ok='{str(r.ok).lower()}' "
                        f"style='color:{colour}'>{esc(r.line())}</div>{hint}"
                        f"{diagnostics_html(r.notes) if r.notes else ''}")
        name = self.target_runs[0].target
        return (f"<div class='wb-target'><b>on {esc(name)}</b> ({esc(self.target.label)}; "
                "emulated by QEMU: its time is not a phone's)" + "".join(rows) + "</div>")
