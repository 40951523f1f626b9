"""The prune panel: ``wb.prune`` with its amount, method and width rounding, the report's
figures before and after (parameters, MACs, ONNX and ncnn sizes, latency on each backend) and
its notes (unstructured pruning keeps every weight in the deployed files).

The amount is not clamped by the control: an amount outside [0, 1) goes to ``wb.prune``,
whose hinted error the panel shows. The engine's progress callback drives the bar.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ...artifact.workspace import Workspace
from ...stages.prune import prune
from ...stages.prune_methods import METHODS
from ..code import Code, call, program
from ..html import esc
from .base import StagePanel

ROUND_TO = [("8 (packed kernels)", 8), ("4", 4), ("16", 16), ("exact widths (None)", None)]
BACKENDS = ("onnxruntime", "ncnn")


class PrunePanel(StagePanel):
    """``wb.prune`` on the model: amount, method, round_to, the backends measured."""

    stage, title, var = "prune", "Prune", "pr"

    def __init__(self, model: Any, inputs: Any, *, workspace: Workspace | str | None = None,
                 amount: float = 0.5, method: str = "l1-structured", round_to: int | None = 8,
                 backends: tuple[str, ...] = BACKENDS, repeat: int = 15,
                 threads: int = 1) -> None:
        self.model = model
        self.inputs = inputs
        self._init = dict(amount=amount, method=method, round_to=round_to,
                          backends=tuple(backends), repeat=repeat, threads=threads)
        super().__init__(workspace=workspace)

    @property
    def needs_model(self) -> bool:
        return True

    def _controls(self) -> list[Any]:
        i = self._init
        # FloatText, not a bounded one: an amount out of range is refused with its hint,
        # never silently clamped to something the user did not ask for
        self.amount = widgets.FloatText(value=i["amount"], description="amount",
                                        tooltip="the fraction of conv/linear weights to take "
                                        "away, in [0, 1)")
        self.method = widgets.Dropdown(options=list(METHODS), value=i["method"],
                                       description="method")
        self.round_to = widgets.Dropdown(options=ROUND_TO, value=i["round_to"],
                                         description="round_to")
        self.backends = {b: widgets.Checkbox(value=b in i["backends"], description=b,
                                             indent=False, layout=widgets.Layout(width="130px"))
                         for b in BACKENDS}
        self.repeat = widgets.BoundedIntText(value=i["repeat"], min=1, max=1000,
                                             description="timed runs")
        self.threads = widgets.BoundedIntText(value=i["threads"], min=1, max=256,
                                              description="threads")
        self.method.observe(self._method_changed, names="value")
        self._method_changed()
        return [widgets.HBox([self.amount, self.method, self.round_to]),
                widgets.HBox([widgets.HTML("measured on:", layout=widgets.Layout(width="95px")),
                              *self.backends.values(),
                              self.repeat, self.threads])]

    def _watched(self) -> list[Any]:
        return [self.amount, self.method, self.round_to, *self.backends.values(), self.repeat,
                self.threads]

    def _method_changed(self, _change: Any = None) -> None:
        self.round_to.disabled = self.method.value != "l1-structured"  # widths: structured

    def settings(self) -> dict[str, Any]:
        """``wb.prune``'s arguments: amount and method first, then the keywords (round_to
        only for structured pruning, where it applies)."""
        out: dict[str, Any] = {"amount": self.amount.value, "method": self.method.value}
        if self.method.value == "l1-structured":
            out["round_to"] = self.round_to.value
        out["backends"] = tuple(b for b, box in self.backends.items() if box.value)
        if out["backends"]:
            out.update(repeat=self.repeat.value, threads=self.threads.value)
        return out

    def _execute(self, settings: dict[str, Any]) -> Any:
        s = dict(settings)
        amount, method = s.pop("amount"), s.pop("method")
        return prune(self.model, amount, method, example_inputs=self.inputs,
                     workspace=self._ws(), progress=self._on_step, **s)

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        s = dict(settings)
        amount, method = s.pop("amount"), s.pop("method")
        return [call(self.var, "wb.prune", ["model", repr(amount)],
                     {"method": method, "example_inputs": Code("inputs"), **s,
                      "workspace": Code("ws")})]

    def code(self) -> str:
        """The prune call, then its report printed (a PruneResult has no summary())."""
        body, needs_model = self._chain()
        return program(body + [f"print({self.var}.report)"], needs_model)

    def _render(self, result: Any) -> None:
        self.result_html.value = prune_html(result.report)


def prune_html(rep: Any) -> str:
    """The report as the panel shows it: the summary line, each figure unpruned / pruned /
    ratio (a ratio below 0.95 in green, above 1.05 in red), the output change, the notes."""
    def ratio(r: float | None) -> str:
        if r is None:
            return "-"
        colour = "#2e7d32" if r < 0.95 else "#c62828" if r > 1.05 else "#555"
        return f"<b style='color:{colour}'>x{r:.2f}</b>"

    def num(v: float) -> str:
        return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:.3g}"

    rows = "".join(
        f"<tr><td>{esc(k)}</td><td style='text-align:right'>{num(v.before)}</td>"
        f"<td style='text-align:right'>{num(v.after)}</td>"
        f"<td style='text-align:right'>{ratio(v.ratio)}</td></tr>"
        for k, v in rep.figures().items())
    notes = "".join(f"<li>{esc(n)}</li>" for n in rep.notes())
    timing = (f"<div style='color:#777'>latency: medians of {rep.repeat} alternating runs, "
              f"{rep.threads} thread(s), load {rep.load[0]:.1f} -&gt; {rep.load[1]:.1f}</div>"
              if rep.ort_ms or rep.ncnn_ms else "")
    return (f"<div class='wb-summary'>{esc(rep.summary())}</div>"
            f"<table class='wb-prune-table' style='font-size:12px'><tr><th>figure</th>"
            f"<th>unpruned</th><th>pruned</th><th>after/before</th></tr>{rows}</table>"
            f"<div>output vs unpruned: SNR {rep.snr_db:.1f} dB, max abs {rep.max_abs:.3g}"
            f"</div>{timing}<ul class='wb-prune-notes'>{notes}</ul>")
