"""The frame of every stage panel (StagePanel): controls, Run, progress, result, preview.

A stage defines its controls, ``settings()`` (the engine keyword arguments they stand for),
``_execute(settings)`` and ``_render(result)``; the frame runs it, catches and shows errors,
and tells listeners (the pipeline) of each result. What "Show code" writes is the other
half, ``codegen.PanelCode``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
from IPython.display import display

from ...artifact.record import Artifact
from ...artifact.workspace import Workspace, as_workspace
from ...progress import Step
from ..graphview import GraphView
from ..html import artifact_html, code_block_html, error_html, esc, histogram_html
from ..netronview import netron
from .codegen import PanelCode


def comma_names(text: str) -> list[str] | None:
    """The names in a comma-separated text box (None when there are none)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return names or None


class StagePanel(PanelCode):
    """The common frame of a stage panel: controls, Run, progress, result, preview, code."""

    stage = "stage"
    title = "Stage"
    var = "art"
    tab: str | None = None  # the pipeline's tab title (the title without its number if None)

    def __init__(self, *, workspace: Workspace | str | None = None) -> None:
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

        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play",
                                         tooltip=f"run {self.stage} with these settings")
        self.code_toggle = widgets.ToggleButton(description="Show code", icon="code", value=False,
                                                tooltip="the engine calls for these settings")
        self.netron_button = widgets.Button(description="Netron", icon="sitemap", disabled=True,
                                            tooltip="open the result in Netron, inline")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="",
                                            layout=widgets.Layout(width="160px"))
        self.status = widgets.HTML(value="<span style='color:#777'>not run yet</span>")
        self.stale_html = widgets.HTML(value="")  # set by the pipeline: made from an older input
        self.result_html = widgets.HTML(value="")
        self.code_html = widgets.HTML(value="", layout=widgets.Layout(display="none"))
        self.preview = widgets.Box(layout=widgets.Layout(flex_flow="column"))
        self.log = widgets.Output(layout=widgets.Layout(max_height="200px", overflow="auto"))
        self.netron_out = widgets.Output()
        self.controls = self._controls()
        self._connect()
        self.widget = self._frame()

    def _connect(self) -> None:
        """The buttons' callbacks; a change of a watched control rewrites the code shown."""
        for c in self._watched():
            c.observe(self._refresh_code, names="value")
        self.run_button.on_click(lambda _b: self.run())
        self.code_toggle.observe(self._toggle_code, names="value")
        self.netron_button.on_click(lambda _b: self.show_netron())

    def _frame(self) -> Any:
        """Title, controls, the Run bar, code, log, result, preview, Netron: one box."""
        bar = widgets.HBox([self.run_button, self.code_toggle, self.netron_button,
                            self.progress, self.status, self.stale_html],
                           layout=widgets.Layout(align_items="center"))
        box = widgets.VBox(
            [widgets.HTML(f"<h4 style='margin:4px 0'>{esc(self.title)}</h4>"),
             widgets.VBox(self.controls), bar, self.code_html, self.log, self.result_html,
             self.preview, self.netron_out],
            layout=widgets.Layout(border="1px solid #ddd", padding="6px"))
        box.add_class(f"wb-panel-{self.stage}")
        box.add_class("wb-panel")
        return box

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
        self._begin()
        t0 = time.perf_counter()
        try:
            result = self._execute_in_log(self.settings())
        except Exception as e:  # shown in the panel: a button callback must not raise
            self._failed(e, time.perf_counter() - t0)
            return None
        finally:
            self.run_button.disabled = False
        self._succeeded(result, time.perf_counter() - t0)
        return result

    def _begin(self) -> None:
        """Clear what the last run showed and say this one is running."""
        self.error = None
        self.run_button.disabled = True
        self.progress.bar_style = "info"
        self.progress.value = 0
        self.progress.max = 1
        self.status.value = f"<span class='wb-running'>running {esc(self.stage)}&hellip;</span>"
        self.result_html.value = ""
        self.preview.children = ()  # a new run replaces what the last one showed
        self.netron_out.clear_output()
        self.netron_button.disabled = True
        self.log.clear_output()

    def _execute_in_log(self, settings: dict[str, Any]) -> Any:
        """``_execute``, with the engine's tqdm bars and prints landing in the panel's log."""
        result = None
        failure: Exception | None = None
        with self.log:
            try:  # caught in here: in a kernel, Output.__exit__ swallows exceptions
                result = self._execute(settings)
            except Exception as e:
                failure = e
        if failure is not None:
            raise failure
        return result

    def _failed(self, e: Exception, seconds: float) -> None:
        """Show the error with its hint and keep it in ``self.error``."""
        self.error = e
        self.seconds = seconds
        self.progress.bar_style = "danger"
        self.status.value = (f"<span class='wb-failed' style='color:#c62828'>failed after "
                             f"{self.seconds:.1f} s</span>")
        self.result_html.value = error_html(e)
        self._on_error(e)

    def _succeeded(self, result: Any, seconds: float) -> None:
        """Keep the result, show it (a display problem is shown, the result kept), then tell
        the listeners (one that cannot take it is shown here too)."""
        self.seconds = seconds
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

    def _on_error(self, e: BaseException) -> None:
        pass

    def _on_step(self, step: Step) -> None:
        """Progress within the stage (the engine's ``progress=`` callback): the bar counts
        its steps, the status names the phase."""
        self.progress.max = max(1, step.total)
        self.progress.value = min(step.done, self.progress.max)
        self.status.value = (f"<span class='wb-running'>{esc(step.stage)}: "
                             f"{esc(step.phase)} ({step.done}/{step.total})&hellip;</span>")

    def mark_stale(self, why: str | None) -> None:
        """Say (or stop saying) that the result was made from an input that is no longer the
        newest of its stage (``why``: from what, and what is newest now)."""
        self.stale_html.value = "" if not why else (
            f"<span class='wb-stale' style='color:#8d6e00;background:#fff8e1;padding:0 4px' "
            f"title='{esc(why)}'>&#9888; stale: {esc(why)}; run again</span>")

    def _show_preview(self, art: Artifact) -> None:
        """The graph: a GraphView, or the op histogram if the graph cannot be drawn."""
        try:
            view = GraphView(art)
        except Exception:  # the histogram still says what the graph holds
            view = widgets.HTML(histogram_html(art.graph.op_histogram,
                                               f"{art.id}: op histogram"))
        self.preview.children = (view,)

    def show_netron(self) -> Any:
        """Show the result in Netron below the panel (through the Jupyter server)."""
        self.netron_out.clear_output()
        if self.artifact is None:
            return None
        try:
            view = netron(self.artifact)
        except Exception as e:
            self.netron_out.append_display_data(widgets.HTML(error_html(e)))
            return None
        with self.netron_out:
            display(view)
        return view

    # -- code (what it says: codegen.PanelCode) -------------------------------------------
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
