"""The compare panel: op by op, the table and the graph coloured by error; its ncnn candidates
run on a chosen target (this machine, or ncnn's ARM build under QEMU) in a chosen precision."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ...artifact.record import Artifact
from ...artifact.workspace import Workspace
from ...comparison.compare import compare
from ...comparison.task import check_task
from ...errors import InputError
from ...runtime.ncnn_flags import PRECISIONS, check_precision
from ...runtime.ncnn_runner import NcnnRunner
from ...stages.ncnn_target import check_target, target_options
from ..code import Code, call, literal
from ..compareview import CompareView
from ..graphview import GraphView
from ..html import error_html, esc
from .base import StagePanel


# -- compare -------------------------------------------------------------------------------
class ComparePanel(StagePanel):
    """Op by op, torch against the ONNX and ncnn artifacts: mode, tolerance; with ``task``
    (a task metric, ``wb.TopK(1, data=...)``) each candidate's answers are scored too. The
    ncnn candidates run on ``target`` (None: this machine; an ARM target: ncnn's aarch64
    build under QEMU) in ``ncnn_precision`` (``NcnnRunner(precision=)``)."""

    stage, title, var = "compare", "6. Compare op by op", "rep"

    def __init__(self, model: Any, inputs: Any, candidates: list[Any] | None = None, *,
                 workspace: Workspace | str | None = None, mode: str = "both",
                 tolerance: float | None = None, task: Any = None, target: str | None = None,
                 ncnn_precision: str = "fp32") -> None:
        self.task = None if task is None else check_task(task)
        self.model = model
        self.inputs = inputs
        self.candidates: list[Any] = list(candidates or [])
        self.left_out: dict[str, str] = {}  # artifact id -> why compare does not check it
        self.compared: list[Any] = []  # the candidates of the last successful run
        self._init = dict(mode=mode, tolerance=tolerance,
                          target=check_target(target, installed=False),
                          ncnn_precision=check_precision(ncnn_precision))
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
        self.target = widgets.Dropdown(options=target_options(), value=self._init["target"],
                                       description="ncnn on",
                                       layout=widgets.Layout(width="640px"))
        self.ncnn_precision = widgets.Dropdown(options=list(PRECISIONS),
                                               value=self._init["ncnn_precision"],
                                               description="ncnn in")
        self.candidates_html = widgets.HTML()
        self._show_candidates()
        return [widgets.HBox([self.mode, self.tolerance]),
                widgets.HBox([self.target, self.ncnn_precision]), self.candidates_html]

    def _watched(self) -> list[Any]:
        return [self.mode, self.tolerance, self.target, self.ncnn_precision]

    def ncnn_settings(self) -> dict[str, Any]:
        """How the ncnn candidates run: {"target", "precision"} (NcnnRunner's keywords)."""
        return {"target": self.target.value, "precision": self.ncnn_precision.value}

    def _as_runners(self) -> bool:
        s = self.ncnn_settings()
        return s["target"] is not None or s["precision"] != "fp32"

    @staticmethod
    def _is_ncnn(c: Any) -> bool:
        return getattr(c, "format", None) == "ncnn" or str(c).endswith(".ncnn.param")

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
        run = cands
        if self._as_runners():
            ncnn = self.ncnn_settings()
            check_target(ncnn["target"])  # a missing ARM environment: said before any run
            run = [NcnnRunner(c, num_threads=1, **ncnn) if self._is_ncnn(c) else c
                   for c in cands]
        report = compare(self.model, run, self.inputs, progress=self._on_step, **settings)
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

    def _runner_names(self, names: list[str]) -> list[str]:
        """``names`` with each ncnn candidate's wrapped in the runner that runs it on the
        target in the precision chosen (the candidates by position; a name the panel does not
        hold, as the pipeline's ``nc``, by its variable name)."""
        if not self._as_runners():
            return names
        s = self.ncnn_settings()
        kw = "".join(f", {k}={literal(v)}" for k, v in (("precision", s["precision"]),
                                                       ("target", s["target"])) if v)
        kinds = [self._is_ncnn(c) for c in self.candidates] if len(self.candidates) == len(
            names) else [n == "nc" or n.endswith(".ncnn.param'") for n in names]
        return [f"wb.runtime.NcnnRunner({n}{kw})" if k else n for n, k in zip(names, kinds,
                                                                            strict=True)]

    def _body_for(self, names: list[str], settings: dict[str, Any] | None = None) -> str:
        """The compare call on the candidates held in variables ``names`` (a task's data and
        Custom fn as variables, a comment line saying so); ncnn candidates as runners when a
        target or an ncnn precision is chosen."""
        settings = dict(self.settings() if settings is None else settings)
        names = self._runner_names(names)
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
