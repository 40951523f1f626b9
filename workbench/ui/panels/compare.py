"""The compare panel: op by op, the table and the graph coloured by error."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ...artifact.record import Artifact
from ...artifact.workspace import Workspace
from ...comparison.compare import compare
from ...comparison.task import check_task
from ...errors import InputError
from ..code import Code, call
from ..compareview import CompareView
from ..graphview import GraphView
from ..html import error_html, esc
from .base import StagePanel


# -- compare -------------------------------------------------------------------------------
class ComparePanel(StagePanel):
    """Op by op, torch against the ONNX and ncnn artifacts: mode, tolerance; with ``task``
    (a task metric, ``wb.TopK(1, data=...)``) each candidate's answers are scored too."""

    stage, title, var = "compare", "6. Compare op by op", "rep"

    def __init__(self, model: Any, inputs: Any, candidates: list[Any] | None = None, *,
                 workspace: Workspace | str | None = None, mode: str = "both",
                 tolerance: float | None = None, task: Any = None) -> None:
        self.task = None if task is None else check_task(task)
        self.model = model
        self.inputs = inputs
        self.candidates: list[Any] = list(candidates or [])
        self.left_out: dict[str, str] = {}  # artifact id -> why compare does not check it
        self.compared: list[Any] = []  # the candidates of the last successful run
        self._init = dict(mode=mode, tolerance=tolerance)
        super().__init__(workspace=workspace)
        self.netron_button.layout.display = "none"

    @property
    def needs_model(self) -> bool:
        return True

    def _controls(self) -> list[Any]:
        self.mode = widgets.Dropdown(options=["accumulated", "isolated", "both"],
                                     value=self._init["mode"], description="mode")
        tol = self._init["tolerance"]
        self.tolerance = widgets.Text(value="" if tol is None else str(tol),
                                      description="tolerance", placeholder="default")
        self.candidates_html = widgets.HTML()
        self._show_candidates()
        return [widgets.HBox([self.mode, self.tolerance]), self.candidates_html]

    def _watched(self) -> list[Any]:
        return [self.mode, self.tolerance]

    def set_candidates(self, candidates: list[Any], left_out: dict[str, str] | None = None
                       ) -> None:
        """The artifacts to compare against the torch model; ``left_out``: artifacts not
        compared, by id, with why (a stale stage), said beside the candidates."""
        self.candidates = list(candidates)
        self.left_out = dict(left_out or {})
        self._show_candidates()
        self._refresh_code()

    def _show_candidates(self) -> None:
        names = ", ".join(getattr(c, "id", str(c)) for c in self.candidates) or "none yet"
        out = "".join(f"<div class='wb-left-out' style='color:#8d6e00'>not compared: "
                      f"{esc(i)} (stale: {esc(why)})</div>" for i, why in self.left_out.items())
        task = ""
        if self.task is not None:
            over = (f"{len(self.task.data)} sample(s)" if self.task.data is not None
                    else "the inputs")
            task = f"<div class='wb-task-setting'>task: {esc(self.task.name)} over {over}</div>"
        self.candidates_html.value = f"<div>candidates: {esc(names)}</div>{out}{task}"

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
        out: dict[str, Any] = {"mode": self.mode.value, "tolerance": tolerance}
        if self.task is not None:
            out["task"] = self.task
        return out

    def _execute(self, settings: dict[str, Any]) -> Any:
        if not self.candidates:
            raise InputError("nothing to compare yet", "run export (and ncnn) first")
        cands = list(self.candidates)
        report = compare(self.model, cands, self.inputs, progress=self._on_step, **settings)
        self.compared = cands
        return report

    def _render(self, report: Any) -> None:
        lines = report.summary().splitlines()
        task = report.task_lines()  # the summary's last lines: shown as the task's
        head = lines[:len(lines) - len(task)]
        self.result_html.value = (f"<pre class='wb-summary'>{esc(chr(10).join(head))}</pre>"
                                  + "".join(f"<div class='wb-task'>{esc(t)}</div>"
                                            for t in task))
        try:
            view = CompareView(report, summary=False)  # the result above holds it
        except Exception:  # the report's own HTML table still shows every row
            view = None
        if view is None:
            view = widgets.HTML(report._repr_html_())
        self.preview.children = (view, *self._error_graph(report))

    def _error_graph(self, report: Any) -> list[Any]:
        """A candidate's graph coloured by accumulated error (a GraphView), to pick from."""
        names = [c.name for c in report.candidates]
        color_by = "accumulated"
        self.graph_of = widgets.Dropdown(options=names, value=names[0], description="graph of")
        box = widgets.VBox()

        def draw(_change: Any = None) -> None:
            cand = next(c for c in report.candidates if c.name == self.graph_of.value)
            try:
                box.children = (GraphView(cand.path, report=report, color_by=color_by,
                                          candidate=cand.name),)
            except Exception as e:  # e.g. a candidate the view cannot draw
                box.children = (widgets.HTML(error_html(e)),)

        self.graph_of.observe(draw, names="value")
        draw()
        return [self.graph_of, box]

    def _chain(self) -> tuple[list[str], bool]:
        lines = [self._ws_line()]
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
        """The compare call on the candidates held in variables ``names`` (a task's data and
        Custom fn as variables, a comment line saying so)."""
        settings = dict(self.settings() if settings is None else settings)
        head = []
        task = settings.get("task")
        if task is not None:
            settings["task"] = Code(task.code("task_data", "task_fn"))
            if task.data is not None:
                head.append(f"# task_data: the evaluation set given to the task "
                            f"({len(task.data)} sample(s))")
            if getattr(task, "fn", None) is not None or getattr(task, "decode", None):
                head.append("# task_fn: the function given to the task")
        return "\n".join([*head, call(self.var, "wb.compare",
                                      ["model", f"[{', '.join(names)}]", "inputs"], settings)])

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        return []
