"""The quantize panel: int8 for ONNX Runtime or ncnn, calibrated, with layers kept in float.

The calibration source is the example inputs with seeded noise (enough to try int8 on any
model at once) or a folder of ``.npy`` files or images. The exclude list is picked from the
sensitivity ranking of the last comparison (``rep.sensitivity()``: the layers whose own error
costs the final output most), plus any names typed in. Errors (a folder that is not one, an
exclude name that is no layer) come from ``wb.quantize`` and are shown with their hints.
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets

from ...artifact.record import Artifact
from ...artifact.workspace import Workspace
from ...errors import InputError
from ...stages.quantize import exclude_names, quantize
from ..code import Code, call
from ..html import artifact_html, error_html, esc
from .base import StagePanel, comma_names

BACKEND_OF_FORMAT = {"onnx": "onnxruntime", "ncnn": "ncnn"}
METHODS = {"onnxruntime": ("minmax", "entropy", "percentile"), "ncnn": ("kl", "aciq", "minmax")}
EXAMPLE, FOLDER = "example", "folder"


def noisy_samples(inputs: Any, count: int, noise: float, seed: int) -> list[tuple[Any, ...]]:
    """``count`` copies of the example inputs, each float tensor plus seeded Gaussian noise
    of ``noise`` times its standard deviation: calibration when no real data is at hand.
    The panel's code shows these same lines (the same seed gives the same samples)."""
    import torch  # heavy: loaded only when calibrating on the example inputs

    xs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    for k, t in enumerate(xs):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise InputError(f"example input {k} is a {getattr(t, 'dtype', type(t).__name__)}"
                             ", not a float tensor: noise cannot be added to it",
                             "calibrate from a folder of .npy files or images instead "
                             "(calibration: a folder)")
    g = torch.Generator().manual_seed(seed)
    return [tuple(t + noise * t.std() * torch.randn(t.shape, generator=g) for t in xs)
            for _ in range(count)]


class QuantizePanel(StagePanel):
    """int8 through ``wb.quantize``: calibration source, backend, method, per-channel,
    the layers kept in float (picked from the last comparison's sensitivity ranking)."""

    stage, title, var = "quantize", "7. Quantize to int8", "q8"

    def __init__(self, model: Any = None, inputs: Any = None, *, source: Artifact | None = None,
                 workspace: Workspace | str | None = None, backend: str | None = None,
                 method: str | None = None, per_channel: bool = True,
                 calibration: str | None = None, samples: int = 8, noise: float = 0.05,
                 seed: int = 0, exclude: str = "") -> None:
        self.model = model
        self.inputs = inputs
        # the float artifact each backend quantizes (the pipeline keeps both up to date)
        self.sources: dict[str, Artifact] = {}
        self.upstreams: dict[str, StagePanel] = {}
        self.report: Any = None  # the comparison the sensitivity ranking comes from
        self.ranking: list[Any] = []
        if backend is None:
            backend = BACKEND_OF_FORMAT.get(getattr(source, "format", ""), "ncnn")
        if backend not in METHODS:
            raise InputError(f"backend={backend!r} is not one of {tuple(METHODS)}",
                             "onnxruntime quantizes an ONNX artifact, ncnn an ncnn one")
        self._init = dict(backend=backend, method=method or METHODS[backend][0],
                          per_channel=per_channel, calibration=calibration or "",
                          samples=samples, noise=noise, seed=seed, exclude=exclude)
        super().__init__(workspace=workspace)
        if source is not None:
            self.set_source(source)
        self._select()

    @property
    def needs_model(self) -> bool:
        return self.calibration.value == EXAMPLE  # the samples are made from ``inputs``

    def _controls(self) -> list[Any]:
        i = self._init
        self.backend = widgets.Dropdown(options=list(METHODS), value=i["backend"],
                                        description="backend")
        self.method = widgets.Dropdown(options=list(METHODS[i["backend"]]),
                                       value=i["method"] if i["method"] in METHODS[i["backend"]]
                                       else METHODS[i["backend"]][0], description="method")
        self.per_channel = widgets.Checkbox(value=i["per_channel"], indent=False,
                                            description="per-channel weights")
        self.calibration = widgets.Dropdown(
            options=[("example inputs + seeded noise", EXAMPLE), ("a folder", FOLDER)],
            value=FOLDER if i["calibration"] else EXAMPLE, description="calibrate on")
        self.folder = widgets.Text(value=i["calibration"], description="folder",
                                   placeholder=".npy files or images")
        self.samples = widgets.BoundedIntText(value=i["samples"], min=1, max=10000,
                                              description="samples")
        self.noise = widgets.FloatText(value=i["noise"], description="noise x std")
        self.seed = widgets.IntText(value=i["seed"], description="seed")
        self.exclude_pick = widgets.SelectMultiple(options=[], rows=5, description="keep float",
                                                   layout=widgets.Layout(width="440px"))
        self.exclude_more = widgets.Text(value=i["exclude"], description="and names",
                                         placeholder="layer or node names, comma-separated")
        self.rank_button = widgets.Button(description="Rank layers", icon="sort-amount-desc",
                                          tooltip="the last comparison's sensitivity ranking: the "
                                          "layers whose own error costs the output most")
        self.rank_html = widgets.HTML(value="<i>run compare (mode both, an int8 candidate), then "
                                      "Rank layers to pick what stays in float</i>")
        self.backend.observe(self._backend_changed, names="value")
        self.calibration.observe(self._calibration_changed, names="value")
        self.rank_button.on_click(lambda _b: self.rank())
        self._calibration_changed()
        return [widgets.HBox([self.backend, self.method, self.per_channel]),
                widgets.HBox([self.calibration, self.folder]),
                widgets.HBox([self.samples, self.noise, self.seed]),
                widgets.HBox([self.exclude_pick,
                              widgets.VBox([self.exclude_more, self.rank_button])]),
                self.rank_html]

    def _watched(self) -> list[Any]:
        return [self.backend, self.method, self.per_channel, self.calibration, self.folder,
                self.samples, self.noise, self.seed, self.exclude_pick, self.exclude_more]

    # -- sources, from the pipeline or the caller ---------------------------------------
    def set_source(self, art: Artifact) -> None:
        """The float artifact to quantize for its backend (ONNX: onnxruntime, ncnn: ncnn)."""
        backend = BACKEND_OF_FORMAT.get(art.format)
        if backend is None:
            raise InputError(f"quantize takes an ONNX or ncnn artifact; {art.id} is "
                             f"{art.format}", "give the artifact of export, simplify, "
                             "raise_ops or to_ncnn")
        self.sources[backend] = art
        self._select()

    def _select(self) -> None:
        backend = self.backend.value
        self.source = self.sources.get(backend)
        self.upstream = self.upstreams.get(backend)

    def _backend_changed(self, change: dict) -> None:
        options = list(METHODS[change["new"]])
        self.method.options = options
        self.method.value = options[0]
        self.per_channel.disabled = change["new"] == "ncnn"  # ncnn's scales always are
        self._select()
        self._show_ranking([])  # another backend's layer names would not fit
        self._refresh_code()

    def _calibration_changed(self, _change: Any = None) -> None:
        folder = self.calibration.value == FOLDER
        self.folder.layout.display = "" if folder else "none"
        self.noise.layout.display = "none" if folder else ""

    # -- the sensitivity ranking -------------------------------------------------------
    def set_report(self, report: Any) -> None:
        """The comparison to rank layers from (the pipeline passes each new one)."""
        self.report = report
        self._show_ranking([])

    def rank(self) -> list[Any]:
        """Rank the layers of the last comparison's candidate on this backend (the furthest
        from the reference when there are several) and offer them to keep in float. Never
        raises: an error is shown below the button."""
        try:
            ranking = self._rank()
        except Exception as e:  # shown in the panel: a button callback must not raise
            self.rank_html.value = error_html(e)
            return []
        self._show_ranking(ranking)
        return ranking

    def _rank(self) -> list[Any]:
        rep = self.report
        if rep is None:
            raise InputError("no comparison to rank layers from yet",
                             "run compare with mode 'both' (or 'isolated') first, with the "
                             "int8 artifact among its candidates")
        backend = self.backend.value
        kind = "onnx" if backend == "onnxruntime" else "ncnn"
        names = [c.name for c in rep.candidates if c.kind == kind]
        if not names:
            raise InputError(f"the last comparison has no {backend} candidate",
                             f"run {backend} first, then compare, then rank")
        worst = {n: math.inf for n in names}
        for r in rep.records:
            if r.candidate in worst and r.mode == "accumulated":
                worst[r.candidate] = min(worst[r.candidate], r.metrics.snr_db)
        return rep.sensitivity(candidate=min(names, key=lambda n: worst[n]), progress=False)

    def _show_ranking(self, ranking: list[Any]) -> None:
        self.ranking = list(ranking)
        options: dict[str, str] = {}  # node -> label; a node listed once, at its highest rank
        for s in self.ranking:
            final = "-" if s.final_snr_db is None else f"{s.final_snr_db:.1f} dB"
            node = self._parent_node(s)
            options.setdefault(node, f"{node} ({s.reference}): output {final}, own "
                                     f"{s.isolated_snr_db:.1f} dB")
        self.exclude_pick.value = ()
        self.exclude_pick.options = [(label, node) for node, label in options.items()]
        if self.ranking or getattr(ranking, "candidate", ""):
            cand = getattr(ranking, "candidate", "") or self.ranking[0].record.candidate
            precision = getattr(ranking, "precision", "") or "low-precision"
            lines = [f"{len(self.ranking)} {precision} layers of <code>{esc(cand)}</code>, "
                     "most costly first: pick the ones to keep in float"]
            line = getattr(ranking, "input_rounding", None)
            if line is not None:
                lines.append(esc(line.line()))
            unmeasurable = getattr(ranking, "unmeasurable", [])
            if unmeasurable:
                lines.append("unmeasurable, not ranked: " + esc(", ".join(
                    f"{s.reference} ({s.reason})" for s in unmeasurable[:4])))
            floats = getattr(ranking, "floats", [])
            if floats:
                lines.append(f"{len(floats)} layers ran in float, not ranked")
            self.rank_html.value = f"<div class='wb-ranking'>{'<br>'.join(lines)}</div>"
        elif self.report is not None:
            self.rank_html.value = "<i>a comparison is there: Rank layers to list its layers</i>"

    def _parent_node(self, s: Any) -> str:
        """The float model's node a ranked entry keeps float (an int8 ONNX model's
        ``x_DequantizeLinear`` is the node writing ``x`` in the float one); ncnn's layers
        keep their names."""
        node = s.record.node or s.record.name
        if self.backend.value != "onnxruntime" or self.source is None:
            return node
        try:
            names = exclude_names([s.record], self.source, "onnxruntime")
        except InputError:
            return node
        return names[0] if names else node

    # -- the stage ------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        backend = self.backend.value
        out: dict[str, Any] = {"backend": backend, "method": self.method.value}
        if backend == "onnxruntime":
            out["per_channel"] = self.per_channel.value
        exclude = list(self.exclude_pick.value) + (comma_names(self.exclude_more.value) or [])
        if exclude:
            out["exclude"] = list(dict.fromkeys(exclude))
        samples = self.samples.value
        if self.calibration.value == FOLDER:
            folder = self.folder.value.strip()
            if not folder:
                raise InputError("calibration from a folder, but no folder is given",
                                 "write the folder of .npy files or images, or calibrate on "
                                 "the example inputs + seeded noise")
            out["calibration"] = folder
        else:
            out["calibration"] = Code("calibration")
        out["limit"] = samples
        out["seed"] = self.seed.value
        return out

    def _execute(self, settings: dict[str, Any]) -> Any:
        if self.source is None:
            raise InputError(f"quantize has no {settings['backend']} model yet",
                             "run export (for onnxruntime) or ncnn (for ncnn) first, or "
                             "QuantizePanel(source=artifact)")
        kwargs = dict(settings)
        if isinstance(kwargs["calibration"], Code):
            if self.inputs is None:
                raise InputError("calibration on the example inputs, but the panel has none",
                                 "QuantizePanel(model, inputs, ...) or calibrate from a folder")
            kwargs["calibration"] = noisy_samples(self.inputs, self.samples.value,
                                                  self.noise.value, self.seed.value)
        return quantize(self.source, **{**kwargs, "progress": self._on_step})

    def _body(self, settings: dict[str, Any], source_var: str | None) -> list[str]:
        lines = []
        if isinstance(settings["calibration"], Code):
            lines += ["import torch", "",
                      "# calibration: the example inputs plus seeded noise",
                      f"g = torch.Generator().manual_seed({self.seed.value!r})",
                      "xs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)",
                      f"calibration = [tuple(t + {self.noise.value!r} * t.std() * "
                      "torch.randn(t.shape, generator=g) for t in xs)",
                      f"               for _ in range({self.samples.value!r})]"]
        calib = settings["calibration"]
        rest = {k: v for k, v in settings.items() if k != "calibration"}
        arg = calib if isinstance(calib, Code) else repr(calib)
        return lines + [call(self.var, "wb.quantize", [source_var or "src", arg],
                             {**rest, "progress": False})]

    def _render(self, result: Any) -> None:
        m, p = result.metrics, result.params
        snr = m.get("min_snr_db_vs_parent")
        per_output = ", ".join(f"{esc(k)} {v:.1f} dB" for k, v in
                               (m.get("snr_db_vs_parent") or {}).items())
        kept = m.get("kept_float", p.get("exclude")) or []
        head = (f"<div class='wb-quantized'><b>int8 ({esc(p.get('backend'))}, "
                f"{esc(p.get('method') or p.get('format'))})</b>: SNR vs the float parent "
                f"<b class='wb-snr'>{'-' if snr is None else f'{snr:.1f} dB'}</b>"
                f" ({per_output}); {m.get('quantized', '?')} layers quantized; kept in float: "
                f"<span class='wb-kept'>{esc(', '.join(kept)) or 'none'}</span></div>")
        self.result_html.value = head + artifact_html(result)
        self._show_preview(result)
