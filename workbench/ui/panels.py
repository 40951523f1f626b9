"""One ipywidgets panel per stage: controls, Run, progress, result, graph preview, code.

Every panel works headless: ``panel.run()`` is what the Run button calls, it never raises
(an error is shown in the panel with its hint and kept in ``panel.error``), and its state
is plain widget values (``panel.status.value``, ``panel.result_html.value``...) that tests
read. ``panel.code()`` is the engine call for the current settings, ready to paste.
"""

from __future__ import annotations

import html
import re
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..artifact import Artifact, Workspace, as_workspace
from ..errors import InputError, WorkbenchError
from .code import Code, call, program

LEVEL_COLOURS = {"error": "#c62828", "warning": "#ef6c00", "info": "#546e7a"}


def _widgets() -> Any:
    import ipywidgets

    return ipywidgets


def _esc(x: Any) -> str:
    return html.escape(str(x))


def code_block_html(code: Any) -> str:
    """The engine calls ``code()`` writes, as a selectable block; an error there becomes a
    comment in the block (showing code never breaks a panel)."""
    try:
        text = code()
    except Exception as e:  # noqa: BLE001
        text = f"# cannot write the code: {e}"
    return (f"<pre class='wb-code' style='background:#f6f8fa;padding:6px;user-select:text'>"
            f"{_esc(text)}</pre>")


def diagnostics_html(diags: list[Any]) -> str:
    """Diagnostics as a list: level, code, message and hint, coloured by level."""
    if not diags:
        return "<div><i>no diagnostics</i></div>"
    items = []
    for d in diags:
        colour = LEVEL_COLOURS.get(d.level, "#333")
        hint = f"<div style='margin-left:1em'>hint: {_esc(d.hint)}</div>" if d.hint else ""
        where = f" [{_esc(d.source)}]" if d.source else ""
        items.append(f"<li class='wb-diag wb-diag-{_esc(d.level)}'>"
                     f"<b style='color:{colour}'>{_esc(d.level)}</b> "
                     f"<code>{_esc(d.code)}</code>{where}: "
                     f"<span style='white-space:pre-wrap'>{_esc(d.message)}</span>{hint}</li>")
    return "<ul class='wb-diagnostics' style='margin:0;padding-left:1.2em'>" + "".join(items) + "</ul>"


def error_html(e: BaseException) -> str:
    """An error with its hint, as the panel shows it."""
    message = getattr(e, "message", None) or str(e)
    hint = getattr(e, "hint", "")
    if not isinstance(e, WorkbenchError):
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])
        hint = hint or ("an unexpected error inside the stage (the kernel is fine); the last "
                        "frames are below: please report it")
        message = f"{type(e).__name__}: {message}\n{tb}"
    return (f"<div class='wb-error' style='border-left:4px solid #c62828;padding:4px 8px;"
            f"background:#fdecea'><b>{_esc(type(e).__name__)}</b>: "
            f"<span style='white-space:pre-wrap'>{_esc(message)}</span>"
            + (f"<div class='wb-hint'><b>hint:</b> <span style='white-space:pre-wrap'>"
               f"{_esc(hint)}</span></div>" if hint else "") + "</div>")


def histogram_html(ops: dict[str, int], title: str = "ops") -> str:
    """An op histogram as horizontal bars (the preview when no graph view is available)."""
    if not ops:
        return "<i>no ops</i>"
    top = max(ops.values())
    rows = []
    for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
        w = max(2, int(160 * n / top))
        rows.append(f"<tr><td style='text-align:right;padding-right:6px'><code>{_esc(op)}</code>"
                    f"</td><td><div style='background:#5c6bc0;height:10px;width:{w}px;"
                    f"display:inline-block'></div> {n}</td></tr>")
    return (f"<div class='wb-histogram'><b>{_esc(title)}</b>"
            f"<table style='font-size:12px'>{''.join(rows)}</table></div>")


def artifact_html(art: Artifact, before: Any = None) -> str:
    """Summary, node counts before/after, metrics and diagnostics of one artifact."""
    g = art.graph
    parts = [f"<div class='wb-summary'><b>{_esc(art.summary())}</b></div>"]
    if before is not None:
        parts.append(f"<div class='wb-nodes'>nodes: {before.node_count} &rarr; {g.node_count}"
                     "</div>")
    io = ", ".join(_esc(t) for t in g.inputs) + " &rarr; " + ", ".join(_esc(t) for t in g.outputs)
    parts.append(f"<div class='wb-io'>{io}</div>")
    shown = {k: v for k, v in art.metrics.items() if isinstance(v, (int, float, str))}
    if shown:
        cells = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(_fmt(v))}</td></tr>"
                        for k, v in shown.items())
        parts.append(f"<table class='wb-metrics' style='font-size:12px'>{cells}</table>")
    parts.append(diagnostics_html(art.diagnostics))
    return "".join(parts)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _names(text: str) -> list[str] | None:
    names = [n.strip() for n in text.split(",") if n.strip()]
    return names or None


class StagePanel:
    """The common frame of a stage panel: controls, Run, progress, result, preview, code."""

    stage = "stage"
    title = "Stage"
    var = "art"
    tab: str | None = None  # the pipeline's tab title (the title without its number if None)

    def __init__(self, *, workspace: Workspace | str | None = None) -> None:
        w = _widgets()
        self.workspace = workspace if isinstance(workspace, Workspace) else (
            as_workspace(workspace) if workspace is not None else None)
        self.source: Any = None  # the input artifact (set by the pipeline or the caller)
        self.upstream: StagePanel | None = None  # writes the code for a source not run yet
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self._listeners: list[Callable[[StagePanel], None]] = []

        self.run_button = w.Button(description="Run", button_style="primary", icon="play",
                                   tooltip=f"run {self.stage} with these settings")
        self.code_toggle = w.ToggleButton(description="Show code", icon="code", value=False,
                                          tooltip="the engine calls for these settings")
        self.netron_button = w.Button(description="Netron", icon="sitemap", disabled=True,
                                      tooltip="open the result in Netron, inline")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="",
                                      layout=w.Layout(width="160px"))
        self.status = w.HTML(value="<span style='color:#777'>not run yet</span>")
        self.result_html = w.HTML(value="")
        self.code_html = w.HTML(value="", layout=w.Layout(display="none"))
        self.preview = w.Box(layout=w.Layout(flex_flow="column"))
        self.log = w.Output(layout=w.Layout(max_height="200px", overflow="auto"))
        self.netron_out = w.Output()
        self.controls = self._controls()
        for c in self._watched():
            c.observe(self._refresh_code, names="value")
        self.run_button.on_click(lambda _b: self.run())
        self.code_toggle.observe(self._toggle_code, names="value")
        self.netron_button.on_click(lambda _b: self.show_netron())
        bar = w.HBox([self.run_button, self.code_toggle, self.netron_button, self.progress,
                      self.status], layout=w.Layout(align_items="center"))
        self.widget = w.VBox(
            [w.HTML(f"<h4 style='margin:4px 0'>{_esc(self.title)}</h4>"),
             w.VBox(self.controls), bar, self.code_html, self.log, self.result_html,
             self.preview, self.netron_out],
            layout=w.Layout(border="1px solid #ddd", padding="6px"))
        self.widget.add_class(f"wb-panel-{self.stage}")
        self.widget.add_class("wb-panel")

    # -- what a stage defines -------------------------------------------------------------
    def _controls(self) -> list[Any]:
        return []

    def _watched(self) -> list[Any]:
        """Widgets whose change alters the code shown."""
        return [c for c in self.controls if hasattr(c, "value")]

    def settings(self) -> dict[str, Any]:
        """The engine keyword arguments the controls stand for (InputError when unreadable)."""
        return {}

    def _execute(self, settings: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        raise NotImplementedError

    def _render(self, result: Any) -> None:
        self.result_html.value = artifact_html(result, self._before(result))
        self._show_preview(result)

    def _before(self, art: Artifact) -> Any:
        parent = art.parent
        return parent.graph if parent is not None and parent.format == art.format else None

    @property
    def needs_model(self) -> bool:
        return False

    # -- the frame ------------------------------------------------------------------------
    @property
    def artifact(self) -> Artifact | None:
        """The artifact the last successful run wrote (None before, or for compare)."""
        return self.result if isinstance(self.result, Artifact) else None

    def on_result(self, fn: Callable[[StagePanel], None]) -> None:
        """Call ``fn(panel)`` after each successful run (the pipeline chains stages so)."""
        self._listeners.append(fn)

    def _ws(self) -> Workspace:
        if self.workspace is None:
            src = self.source
            ws = getattr(src, "workspace", None) if isinstance(src, Artifact) else None
            self.workspace = ws or as_workspace(None)
        return self.workspace

    def run(self) -> Any:
        """Run the stage with the current settings; what the Run button calls. Never raises."""
        self.error = None
        self.run_button.disabled = True
        self.progress.bar_style = "info"
        self.progress.value = 0
        self.status.value = f"<span class='wb-running'>running {_esc(self.stage)}&hellip;</span>"
        self.result_html.value = ""
        self.preview.children = ()  # a new run replaces what the last one showed
        self.netron_out.clear_output()
        self.netron_button.disabled = True
        self.log.clear_output()
        t0 = time.perf_counter()
        result = None
        try:
            settings = self.settings()
            failure: Exception | None = None
            with self.log:  # the engine's tqdm bars and prints land in the panel
                try:  # caught in here: in a kernel, Output.__exit__ swallows exceptions
                    result = self._execute(settings)
                except Exception as e:
                    failure = e
            if failure is not None:
                raise failure
        except Exception as e:  # shown in the panel: a button callback must not raise
            self.error = e
            self.seconds = time.perf_counter() - t0
            self.progress.bar_style = "danger"
            self.status.value = (f"<span class='wb-failed' style='color:#c62828'>failed after "
                                 f"{self.seconds:.1f} s</span>")
            self.result_html.value = error_html(e)
            self._on_error(e)
            return None
        finally:
            self.run_button.disabled = False
        self.seconds = time.perf_counter() - t0
        self.result = result
        self.progress.value = 1
        ok = getattr(result, "ok", True)
        self.progress.bar_style = "success" if ok else "warning"
        self.status.value = (f"<span class='wb-done'>done in {self.seconds:.1f} s"
                             f"{'' if ok else ' (with errors: see diagnostics)'}</span>")
        try:
            self._render(result)
        except Exception as e:  # a display problem must not lose the result
            self.result_html.value += error_html(e)
        self.netron_button.disabled = self.artifact is None
        self._refresh_code()
        for fn in self._listeners:
            try:
                fn(self)
            except Exception as e:  # the next stage could not take the result: say so here
                self.result_html.value += error_html(e)
        return result

    def _on_error(self, e: BaseException) -> None:
        pass

    def _show_preview(self, art: Artifact) -> None:
        """The graph: a GraphView, or the op histogram if the graph cannot be drawn."""
        w = _widgets()
        view = None
        try:
            from .graphview import GraphView

            view = GraphView(art)
        except Exception:  # the histogram still says what the graph holds
            view = None
        if view is None:
            view = w.HTML(histogram_html(art.graph.op_histogram, f"{art.id}: op histogram"))
        self.preview.children = (view,)

    def show_netron(self) -> Any:
        """Show the result in Netron below the panel (through the Jupyter server)."""
        from IPython.display import display

        from .netron import netron

        self.netron_out.clear_output()
        if self.artifact is None:
            return None
        try:
            view = netron(self.artifact)
        except Exception as e:
            self.netron_out.append_display_data(_widgets().HTML(error_html(e)))
            return None
        with self.netron_out:
            display(view)
        return view

    # -- code -----------------------------------------------------------------------------
    def code(self) -> str:
        """The engine calls for the current settings, ready to paste (runs given model, inputs)."""
        body, needs_model = self._chain()
        if self.stage not in ("custom_ops", "compare"):
            body.append(f"print({self.var}.summary())")
        return program(body, needs_model)

    def _chain(self) -> tuple[list[str], bool]:
        """This panel's lines, preceded by how its source is obtained."""
        ws = self._ws()
        lines = [f"ws = wb.Workspace({str(ws.path)!r})"]
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
            return [f"ws = wb.Workspace({str(self._ws().path)!r})",
                    *self._body(settings, None)], self.needs_model
        lines, needs_model = self.upstream._chain_fresh()
        return lines + self._body(settings, self.upstream.var), needs_model or self.needs_model

    def _toggle_code(self, change: dict) -> None:
        self.code_html.layout.display = "" if change["new"] else "none"
        self._refresh_code()

    def _refresh_code(self, _change: Any = None) -> None:
        if not self.code_toggle.value:
            return
        self.code_html.value = code_block_html(self.code)

    # -- display --------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        state = "error" if self.error else ("done" if self.result is not None else "not run")
        return f"{type(self).__name__}({state})"


# -- export --------------------------------------------------------------------------------
class ExportPanel(StagePanel):
    """torch -> ONNX: exporter, opset, names, dynamic axes, tolerance."""

    stage, title, var = "export", "1. Export to ONNX", "onx"

    def __init__(self, model: Any, inputs: Any, *, workspace: Workspace | str | None = None,
                 exporter: str = "torchscript", opset: int = 17,
                 input_names: list[str] | None = None, output_names: list[str] | None = None,
                 dynamic_axes: dict[str, Any] | None = None, atol: float = 1e-4,
                 rtol: float = 1e-3) -> None:
        from ..inputs import as_tensor_tuple

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
        from ..stages.export import export

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
        from ..customops import registered_ops, registered_symbolics

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
        from ..customops import register_symbolic

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
        w = _widgets()
        self.backend = w.Dropdown(options=["onnxslim", "onnxsim", "onnxscript"],
                                  value=self._init["backend"], description="backend")
        self.atol = w.FloatText(value=self._init["atol"], description="atol")
        self.rtol = w.FloatText(value=self._init["rtol"], description="rtol")
        return [w.HBox([self.backend, self.atol, self.rtol])]

    def settings(self) -> dict[str, Any]:
        return {"backend": self.backend.value, "atol": self.atol.value, "rtol": self.rtol.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        from ..stages.simplify import simplify

        if self.source is None:
            raise InputError("simplify has no ONNX model to work on yet",
                             "run the export panel first (or pass source= an artifact)")
        return simplify(self.source, **settings)

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
        w = _widgets()
        try:
            from ..rules import names

            known = names()
        except Exception:  # the raising rules are not in this version
            known = []
        chosen = self._init["rules"]
        self.rules = w.SelectMultiple(options=known, value=tuple(chosen or known),
                                      description="rules", rows=min(8, max(3, len(known))))
        self.target = w.Dropdown(options=["standard", "functions"], value=self._init["target"],
                                 description="target")
        return [w.HBox([self.rules, self.target])]

    def settings(self) -> dict[str, Any]:
        chosen = list(self.rules.value)
        every = list(self.rules.options)
        return {"rules": None if chosen == every else chosen, "target": self.target.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        from ..stages.raising import raise_ops

        if self.source is None:
            raise InputError("raise has no ONNX model to work on yet",
                             "run export (and simplify) first, or pass source= an artifact")
        if settings["rules"] == []:
            raise InputError("no raising rule is selected", "select at least one rule")
        return raise_ops(self.source, **settings)

    def _render(self, result: Any) -> None:
        super()._render(result)
        try:
            from ..stages.raising import RaiseReport

            report = RaiseReport.of(result)
            text = str(report)
        except Exception:
            return
        self.result_html.value += (f"<details><summary>raising report</summary><pre>"
                                   f"{_esc(text)}</pre></details>")

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return [call(self.var, "wb.raise_ops", [source_var or "src"], settings)]


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
        w = _widgets()
        i = self._init
        options = [("the module (pnnx traces it)", "module"),
                   ("the ONNX model (previous stage)", "onnx")]
        self.from_ = w.Dropdown(options=options, value=i["from_"], description="from")
        self.fp16 = w.Checkbox(value=i["fp16"], description="fp16 weights", indent=False)
        self.optlevel = w.Dropdown(options=[0, 1, 2], value=i["optlevel"],
                                   description="optlevel")
        self.moduleop = w.Text(value=i["moduleop"], description="moduleop",
                               placeholder="Focus, MyBlock")
        self.timeout = w.FloatText(value=i["timeout"], description="timeout s")
        return [w.HBox([self.from_, self.fp16, self.optlevel]),
                w.HBox([self.moduleop, self.timeout])]

    def settings(self) -> dict[str, Any]:
        return {"fp16": self.fp16.value, "optlevel": self.optlevel.value,
                "moduleop": _names(self.moduleop.value) or [], "timeout": self.timeout.value}

    def _execute(self, settings: dict[str, Any]) -> Any:
        from ..stages.ncnn import to_ncnn

        if self.from_.value == "module":
            if self.model is None:
                raise InputError("ncnn from the module needs the model and inputs",
                                 "NcnnPanel(model, inputs) or choose from: the ONNX model")
            return to_ncnn(self.model, self.inputs, workspace=self._ws(), **settings)
        if self.source is None:
            raise InputError("ncnn from ONNX has no ONNX model yet",
                             "run export first, or choose from: the module")
        return to_ncnn(self.source, **settings)

    def _chain(self) -> tuple[list[str], bool]:
        if self.from_.value == "module":  # the source panels are not involved
            ws = self._ws()
            try:
                settings = self.settings()
            except InputError as e:
                return [f"# settings not readable: {e.message}"], True
            return [f"ws = wb.Workspace({str(ws.path)!r})", *self._body(settings, None)], True
        return super()._chain()

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        if self.from_.value == "module":
            return [call(self.var, "wb.to_ncnn", ["model", "inputs"],
                         {"workspace": Code("ws"), **settings})]
        return [call(self.var, "wb.to_ncnn", [source_var or "src"], settings)]

    def _render(self, result: Any) -> None:
        pnnx = result.parent
        self.result_html.value = artifact_html(result) + (
            f"<details><summary>pnnx graph {_esc(pnnx.id)}</summary><pre>"
            f"{_esc(pnnx.graph.text())}</pre></details>" if pnnx is not None else "")
        self._show_preview(result)


# -- compare -------------------------------------------------------------------------------
class ComparePanel(StagePanel):
    """Op by op, torch against the ONNX and ncnn artifacts: mode, tolerance."""

    stage, title, var = "compare", "6. Compare op by op", "rep"

    def __init__(self, model: Any, inputs: Any, candidates: list[Any] | None = None, *,
                 workspace: Workspace | str | None = None, mode: str = "both",
                 tolerance: float | None = None) -> None:
        self.model = model
        self.inputs = inputs
        self.candidates: list[Any] = list(candidates or [])
        self._init = dict(mode=mode, tolerance=tolerance)
        super().__init__(workspace=workspace)
        self.netron_button.layout.display = "none"

    @property
    def needs_model(self) -> bool:
        return True

    def _controls(self) -> list[Any]:
        w = _widgets()
        self.mode = w.Dropdown(options=["accumulated", "isolated", "both"],
                               value=self._init["mode"], description="mode")
        tol = self._init["tolerance"]
        self.tolerance = w.Text(value="" if tol is None else str(tol), description="tolerance",
                                placeholder="default")
        self.candidates_html = w.HTML()
        self._show_candidates()
        return [w.HBox([self.mode, self.tolerance]), self.candidates_html]

    def _watched(self) -> list[Any]:
        return [self.mode, self.tolerance]

    def set_candidates(self, candidates: list[Any]) -> None:
        """The artifacts to compare against the torch model."""
        self.candidates = list(candidates)
        self._show_candidates()
        self._refresh_code()

    def _show_candidates(self) -> None:
        names = ", ".join(getattr(c, "id", str(c)) for c in self.candidates) or "none yet"
        self.candidates_html.value = f"<div>candidates: {_esc(names)}</div>"

    def settings(self) -> dict[str, Any]:
        text = self.tolerance.value.strip()
        tolerance = None
        if text:
            try:
                tolerance = float(text)
            except ValueError:
                raise InputError(f"tolerance {text!r} is not a number",
                                 "write an absolute tolerance such as 1e-4, or leave it "
                                 "empty for the default") from None
        return {"mode": self.mode.value, "tolerance": tolerance}

    def _execute(self, settings: dict[str, Any]) -> Any:
        from ..compare.compare import compare

        if not self.candidates:
            raise InputError("nothing to compare yet", "run export (and ncnn) first")
        return compare(self.model, self.candidates, self.inputs, **settings)

    def _render(self, report: Any) -> None:
        w = _widgets()
        self.result_html.value = (f"<pre class='wb-summary'>{_esc(report.summary())}</pre>")
        try:
            from .compare_view import CompareView

            view = CompareView(report)
        except Exception:  # the report's own HTML table still shows every row
            view = None
        if view is None:
            view = w.HTML(report._repr_html_())
        self.preview.children = (view, *self._error_graph(report))

    def _error_graph(self, report: Any) -> list[Any]:
        """A candidate's graph coloured by accumulated error (a GraphView), to pick from."""
        w = _widgets()
        names = [c.name for c in report.candidates]
        color_by = "accumulated"
        self.graph_of = w.Dropdown(options=names, value=names[0], description="graph of")
        box = w.VBox()

        def draw(_change: Any = None) -> None:
            from .graphview import GraphView

            cand = next(c for c in report.candidates if c.name == self.graph_of.value)
            try:
                box.children = (GraphView(cand.path, report=report, color_by=color_by,
                                          candidate=cand.name),)
            except Exception as e:  # e.g. a candidate the view cannot draw
                box.children = (w.HTML(error_html(e)),)

        self.graph_of.observe(draw, names="value")
        draw()
        return [self.graph_of, box]

    def _chain(self) -> tuple[list[str], bool]:
        ws = self._ws()
        lines = [f"ws = wb.Workspace({str(ws.path)!r})"]
        names = []
        for k, c in enumerate(self.candidates):
            if isinstance(c, Artifact):
                lines.append(f"cand{k} = ws.get({c.id!r})")
                names.append(f"cand{k}")
            else:
                names.append(repr(str(c)))
        try:
            settings = self.settings()
        except InputError as e:
            return lines + [f"# settings not readable: {e.message}"], True
        return lines + [self._body_for(names, settings), f"print({self.var}.summary())"], True

    def _body_for(self, names: list[str], settings: dict[str, Any] | None = None) -> str:
        """The compare call on the candidates held in variables ``names``."""
        settings = self.settings() if settings is None else settings
        return call(self.var, "wb.compare", ["model", f"[{', '.join(names)}]", "inputs"],
                    settings)

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return []
