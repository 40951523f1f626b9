"""The base of every stage panel (StagePanel) and the HTML pieces panels show."""

from __future__ import annotations

import html
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...artifact import Artifact, Workspace, as_workspace
from ...diagnostics import group_diagnostics
from ...errors import InputError, WorkbenchError
from ...progress import Step
from ..code import program

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
    """Diagnostics as a list, grouped (diagnostics.group_diagnostics): the user's own problems
    first, by level, with their hints; repeats and library-internal warnings one line each
    with a count, folded under one summary; site-packages paths shortened."""
    if not diags:
        return "<div><i>no diagnostics</i></div>"
    view = group_diagnostics(diags)
    items = []
    for g in view.own:
        colour = LEVEL_COLOURS.get(g.level, "#333")
        hint = f"<div style='margin-left:1em'>hint: {_esc(g.hint)}</div>" if g.hint else ""
        times = f" <span class='wb-diag-count'>×{g.count}</span>" if g.count > 1 else ""
        where = f" [{_esc(', '.join(g.sources))}]" if g.sources else ""
        items.append(f"<li class='wb-diag wb-diag-{_esc(g.level)}'>"
                     f"<b style='color:{colour}'>{_esc(g.level)}</b> "
                     f"<code>{_esc(g.code)}</code>{times}{where}: "
                     f"<span style='white-space:pre-wrap'>{_esc(g.message)}</span>{hint}</li>")
    if view.internal:
        n = sum(g.count for g in view.internal)
        libs = sorted({g.package for g in view.internal if g.package})
        lines = "".join(f"<li class='wb-diag wb-diag-internal' title='{_esc(g.message)}'>"
                        f"{_esc(g.line())}</li>" for g in view.internal)
        items.append(f"<li class='wb-diag-internal-group' style='color:#78909c'><details>"
                     f"<summary>{n} from library internals ({_esc(', '.join(libs))}), "
                     f"{len(view.internal)} distinct: nothing to change in your model"
                     f"</summary><ul style='padding-left:1.2em'>{lines}</ul></details></li>")
    return ("<ul class='wb-diagnostics' style='margin:0;padding-left:1.2em'>" + "".join(items)
            + "</ul>")


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
        # the path as the user wrote it: Show code keeps it (relative stays relative)
        self.workspace_given = os.fspath(workspace) if isinstance(workspace, (str, os.PathLike)
                                                                  ) else None
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
        self.stale_html = w.HTML(value="")  # set by the pipeline: made from an older input
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
                      self.status, self.stale_html], layout=w.Layout(align_items="center"))
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
        self.progress.max = 1
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
        self.progress.value = self.progress.max
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

    def _on_step(self, step: Step) -> None:
        """Progress within the stage (the engine's ``progress=`` callback): the bar counts
        its steps, the status names the phase."""
        self.progress.max = max(1, step.total)
        self.progress.value = min(step.done, self.progress.max)
        self.status.value = (f"<span class='wb-running'>{_esc(step.stage)}: "
                             f"{_esc(step.phase)} ({step.done}/{step.total})&hellip;</span>")

    def mark_stale(self, why: str | None) -> None:
        """Say (or stop saying) that the result was made from an input that is no longer the
        newest of its stage (``why``: from what, and what is newest now)."""
        self.stale_html.value = "" if not why else (
            f"<span class='wb-stale' style='color:#8d6e00;background:#fff8e1;padding:0 4px' "
            f"title='{_esc(why)}'>&#9888; stale: {_esc(why)}; run again</span>")

    def _show_preview(self, art: Artifact) -> None:
        """The graph: a GraphView, or the op histogram if the graph cannot be drawn."""
        w = _widgets()
        view = None
        try:
            from ..graphview import GraphView

            view = GraphView(art)
        except Exception:  # the histogram still says what the graph holds
            view = None
        if view is None:
            view = w.HTML(histogram_html(art.graph.op_histogram, f"{art.id}: op histogram"))
        self.preview.children = (view,)

    def show_netron(self) -> Any:
        """Show the result in Netron below the panel (through the Jupyter server)."""
        from IPython.display import display

        from ..netronview import netron

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
    def _ws_line(self) -> str:
        """``ws = wb.Workspace(path)`` with the path as the user gave it; for a Workspace
        object, relative to the working directory when it lies below it."""
        ws = self._ws()
        given = self.workspace_given
        if given is None or Path(given).absolute() != ws.path:
            try:
                given = os.path.relpath(ws.path) if ws.path.is_relative_to(Path.cwd()) \
                    else str(ws.path)
            except (OSError, ValueError):  # no working directory, another drive
                given = str(ws.path)
        return f"ws = wb.Workspace({given!r})"

    def code(self) -> str:
        """The engine calls for the current settings, ready to paste (runs given model, inputs)."""
        body, needs_model = self._chain()
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
