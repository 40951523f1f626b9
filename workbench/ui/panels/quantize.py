"""The quantize panel: int8 for ONNX Runtime or ncnn, calibrated, with layers kept in float.

The calibration source is the example inputs with seeded noise (enough to try int8 on any
model at once) or a folder of ``.npy`` files or images, with the model's preprocessing
(size, scale, mean / std: ``precision/preprocess.py``; a folder of images without it is
flagged, naming the range the example inputs have and the one the images give). Some
samples are held out (``holdout``) and the SNR shown is measured on them, with its spread.
The exclude list is picked from the sensitivity ranking of the last comparison
(``rep.sensitivity()``: the layers whose own error costs the final output most), each entry
mapped to the float source's names as ``wb.quantize(..., exclude=rep.sensitive(k))`` maps it
(``precision/exclusion.py``), plus any names typed in (an int8 ranking's names too). Errors
(a folder that is not one, an exclude name that is no layer, a source that is not ok) come
from ``wb.quantize`` and are shown with their hints.
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets

from ...artifact.record import Artifact
from ...artifact.workspace import Workspace
from ...errors import InputError
from ...precision.picking import parse_holdout
from ...precision.preprocess import preprocess_fields
from ...stages.quantize import exclude_names, quantize
from ...stages.quantize_measure import example_inputs
from ..code import Code, call
from ..html import artifact_html, error_html, esc
from .base import StagePanel, comma_names

BACKEND_OF_FORMAT = {"onnx": "onnxruntime", "ncnn": "ncnn"}
METHODS = {"onnxruntime": ("minmax", "entropy", "percentile"), "ncnn": ("kl", "aciq", "minmax")}
EXAMPLE, FOLDER = "example", "folder"
# normalisation presets: the mean / std fields they fill
NORMALISE = {"none": ("", ""),
             "imagenet": ("0.485, 0.456, 0.406", "0.229, 0.224, 0.225"),
             "half": ("0.5", "0.5")}
NO_SOURCE = "no-source"  # the error of a Run before the model to quantize was there


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
                 seed: int = 0, exclude: str = "", preprocess: dict[str, Any] | None = None,
                 holdout: Any = "auto", allow_failed: bool = False) -> None:
        self.model = model
        self.inputs = inputs
        # the float artifact each backend quantizes (the pipeline keeps both up to date)
        self.sources: dict[str, Artifact] = {}
        self.upstreams: dict[str, StagePanel] = {}
        self.report: Any = None  # the comparison the sensitivity ranking comes from
        self.ranking: list[Any] = []
        self.picks: dict[str, list[str]] = {}  # a ranking entry offered -> the names it keeps
        self._stored: dict[str, bool] = {}  # artifact id -> it stores its example inputs
        if backend is None:
            backend = BACKEND_OF_FORMAT.get(getattr(source, "format", ""), "ncnn")
        if backend not in METHODS:
            raise InputError(f"backend={backend!r} is not one of {tuple(METHODS)}",
                             "onnxruntime quantizes an ONNX artifact, ncnn an ncnn one")
        self._init = dict(backend=backend, method=method or METHODS[backend][0],
                          per_channel=per_channel, calibration=calibration or "",
                          samples=samples, noise=noise, seed=seed, exclude=exclude,
                          preprocess=dict(preprocess or {}), holdout=holdout,
                          allow_failed=allow_failed)
        super().__init__(workspace=workspace)
        if source is not None:
            self.set_source(source)
        self._select()

    @property
    def needs_model(self) -> bool:
        # the samples are made from ``inputs``, or the source stores no example inputs
        return self.calibration.value == EXAMPLE or self._lends_example()

    def _lends_example(self) -> bool:
        """The panel's example inputs go to wb.quantize (the source stores none: an ncnn
        model converted from the module) for the range check and the example figure."""
        if self.inputs is None or self.source is None:
            return False
        key = self.source.id
        if key not in self._stored:
            self._stored[key] = example_inputs(self.source) is not None
        return not self._stored[key]

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
        self._prep_controls(i["preprocess"])
        self.holdout = widgets.Text(value=str(i["holdout"]), description="hold out",
                                    placeholder="auto, a count or a share",
                                    tooltip="samples kept out of calibration to measure on")
        self.allow_failed = widgets.Checkbox(value=i["allow_failed"], indent=False,
                                             description="even if the source is not ok")
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
                widgets.HBox([self.calibration, self.folder]), self.prep_box,
                widgets.HBox([self.samples, self.noise, self.seed]),
                widgets.HBox([self.holdout, self.allow_failed]),
                widgets.HBox([self.exclude_pick,
                              widgets.VBox([self.exclude_more, self.rank_button])]),
                self.rank_html]

    def _prep_controls(self, pre: dict[str, Any]) -> None:
        """The folder's preprocessing: normalisation preset, mean, std, scale, size."""
        def text(v: Any) -> str:
            return "" if v is None else ", ".join(str(x) for x in v) if isinstance(
                v, (list, tuple)) else str(v)

        self.normalise = widgets.Dropdown(
            options=[("none (RGB / 255)", "none"), ("ImageNet mean / std", "imagenet"),
                     ("to [-1, 1]", "half"), ("custom", "custom")],
            value="custom" if pre.get("mean") or pre.get("std") else "none",
            description="normalise")
        self.mean = widgets.Text(value=text(pre.get("mean")), description="mean",
                                 placeholder="per channel, e.g. 0.485, 0.456, 0.406")
        self.std = widgets.Text(value=text(pre.get("std")), description="std",
                                placeholder="per channel, e.g. 0.229, 0.224, 0.225")
        self.scale = widgets.Text(value=text(pre.get("scale")) or "1/255", description="scale",
                                  placeholder="1/255 for 8-bit images")
        self.size = widgets.Text(value=text(pre.get("size")), description="size",
                                 placeholder="H, W (empty: the model's)")
        self.normalise.observe(self._preset, names="value")
        self.mean.observe(self._typed, names="value")
        self.std.observe(self._typed, names="value")
        self._presetting = False
        self.prep_box = widgets.VBox([widgets.HBox([self.normalise, self.mean, self.std]),
                                      widgets.HBox([self.scale, self.size])])
        self.prep_box.add_class("wb-preprocess")

    def _preset(self, change: dict) -> None:
        if change["new"] in NORMALISE:
            self._presetting = True
            try:
                self.mean.value, self.std.value = NORMALISE[change["new"]]
            finally:
                self._presetting = False

    def _typed(self, _change: dict) -> None:
        """mean / std typed by hand: the preset says "custom" unless they are its values."""
        if self._presetting:
            return
        typed = (self.mean.value.strip(), self.std.value.strip())
        self.normalise.value = next((k for k, v in NORMALISE.items() if v == typed), "custom")

    def _watched(self) -> list[Any]:
        return [self.backend, self.method, self.per_channel, self.calibration, self.folder,
                self.samples, self.noise, self.seed, self.exclude_pick, self.exclude_more,
                self.mean, self.std, self.scale, self.size, self.holdout, self.allow_failed]

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
        if getattr(self.error, "panel_reason", None) == NO_SOURCE \
                and backend == self.backend.value:
            # the error said the model was missing; it is here now: nothing failed any more
            self.error = None
            self.progress.bar_style = ""
            self.status.value = (f"<span class='wb-ready'>{esc(art.id)} is here: Run "
                                 "quantizes it</span>")
            self.result_html.value = ""

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
        self.prep_box.layout.display = "" if folder else "none"
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
        # what ran in low precision is what there is to rank (an fp32 model's own rounding
        # is no layer to keep float); a float candidate only when nothing else is there
        low = [c.name for c in rep.candidates if c.kind == kind
               and getattr(c, "precision", "fp32") != "fp32"]
        names = low or names
        worst = {n: math.inf for n in names}
        for r in rep.records:
            if r.candidate in worst and r.mode == "accumulated":
                worst[r.candidate] = min(worst[r.candidate], r.metrics.snr_db)
        return rep.sensitivity(candidate=min(names, key=lambda n: worst[n]), progress=False)

    def _show_ranking(self, ranking: list[Any]) -> None:
        self.ranking = list(ranking)
        self.picks = {}
        labels: dict[str, str] = {}  # an entry's first name -> label, at its highest rank
        missing = []
        for s in self.ranking:
            names = self._parent_names(s)
            if not names:
                missing.append(s.record.node or s.record.name)
                continue
            final = "-" if s.final_snr_db is None else f"{s.final_snr_db:.1f} dB"
            more = f" (+ {', '.join(names[1:])})" if len(names) > 1 else ""
            if names[0] not in labels:
                self.picks[names[0]] = names
                labels[names[0]] = (f"{names[0]}{more} ({s.reference}): output {final}, own "
                                    f"{s.isolated_snr_db:.1f} dB")
        self.exclude_pick.value = ()
        self.exclude_pick.options = [(label, node) for node, label in labels.items()]
        if self.ranking or getattr(ranking, "candidate", ""):
            self.rank_html.value = self._ranking_html(ranking, missing)
        elif self.report is not None:
            names = [c.name for c in getattr(self.report, "candidates", [])]
            self.rank_html.value = (f"<i class='wb-rank-ready'>the last comparison holds "
                                    f"{esc(', '.join(names)) or 'no candidate'}: Rank layers to "
                                    "list its layers</i>")

    def _ranking_html(self, ranking: Any, missing: list[str]) -> str:
        cand = getattr(ranking, "candidate", "") or self.ranking[0].record.candidate
        precision = getattr(ranking, "precision", "") or "low-precision"
        lines = [f"{len(self.ranking)} {precision} layers of <code>{esc(cand)}</code>, "
                 "most costly first: pick the ones to keep in float"]
        if missing:
            src = self.source.id if self.source is not None else "no source yet"
            lines.append(f"<span class='wb-unmapped'>{len(missing)} ranked layer(s) have no "
                         f"node or layer in the model quantize starts from ({esc(src)}), so "
                         f"they are not offered: {esc(', '.join(missing[:4]))}"
                         f"{' ...' if len(missing) > 4 else ''}; compare the int8 model of "
                         "this source to rank its own layers</span>")
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
        return f"<div class='wb-ranking'>{'<br>'.join(lines)}</div>"

    def _parent_names(self, s: Any) -> list[str]:
        """The float source's nodes or layers a ranked entry keeps float, as
        ``wb.quantize(source, exclude=[record])`` keeps them (an int8 ONNX model's
        ``x_DequantizeLinear`` is the node writing ``x``, with the weighted op before a ranked
        activation; an ncnn layer with its int8 readers); [] when the source has none of
        them (a ranking of another model's int8 child)."""
        if self.source is None:
            return []
        try:
            return exclude_names([s.record], self.source, self.backend.value)
        except InputError:
            return []

    def picked(self) -> list[str]:
        """The names the picked ranking entries keep float, in rank order."""
        return [n for key in self.exclude_pick.value for n in self.picks.get(key, [key])]

    # -- the stage ------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        backend = self.backend.value
        out: dict[str, Any] = {"backend": backend, "method": self.method.value}
        if backend == "onnxruntime":
            out["per_channel"] = self.per_channel.value
        exclude = self.picked() + (comma_names(self.exclude_more.value) or [])
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
            pre = self.preprocess()
            if pre:
                out["preprocess"] = pre
        else:
            out["calibration"] = Code("calibration")
        out["limit"] = samples
        out["seed"] = self.seed.value
        holdout = parse_holdout(self.holdout.value)
        if holdout != "auto":
            out["holdout"] = holdout
        if self.allow_failed.value:
            out["allow_failed"] = True
        if self._lends_example():
            out["example"] = Code("inputs")
        return out

    def preprocess(self) -> dict[str, Any]:
        """The folder's preprocessing fields as ``wb.quantize``'s ``preprocess=`` ({}: none,
        images read as RGB / 255)."""
        return preprocess_fields(mean=self.mean.value, std=self.std.value,
                                 scale=self.scale.value, size=self.size.value)

    def _execute(self, settings: dict[str, Any]) -> Any:
        if self.source is None:
            e = InputError(f"quantize has no {settings['backend']} model yet",
                           "run export (for onnxruntime) or ncnn (for ncnn) first, or "
                           "QuantizePanel(source=artifact)")
            e.panel_reason = NO_SOURCE  # cleared once the pipeline hands the model over
            raise e
        kwargs = dict(settings)
        if isinstance(kwargs["calibration"], Code):
            if self.inputs is None:
                raise InputError("calibration on the example inputs, but the panel has none",
                                 "QuantizePanel(model, inputs, ...) or calibrate from a folder")
            kwargs["calibration"] = noisy_samples(self.inputs, self.samples.value,
                                                  self.noise.value, self.seed.value)
        if isinstance(kwargs.get("example"), Code):
            kwargs["example"] = self.inputs
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
                               (m.get("snr_db_vs_parent") or {}).items() if v is not None)
        kept = m.get("kept_float", p.get("exclude")) or []
        head = (f"<div class='wb-quantized'><b>int8 ({esc(p.get('backend'))}, "
                f"{esc(p.get('method') or p.get('format'))})</b>: SNR vs the float parent "
                f"<b class='wb-snr'>{'-' if snr is None else f'{snr:.1f} dB'}</b>"
                f" ({per_output}) {_heldout_html(m)}; {m.get('quantized', '?')} layers "
                f"quantized; kept in float: <span class='wb-kept'>"
                f"{esc(', '.join(kept)) or 'none'}</span>{_calibration_html(p)}</div>")
        self.result_html.value = head + artifact_html(result)
        self._show_preview(result)


def _heldout_html(m: dict[str, Any]) -> str:
    """Where the figure was measured, its spread, and the in-sample figure beside it."""
    held = m.get("heldout") or {}
    spread = held.get("snr_db") or {}
    if not held or spread.get("median") is None:
        return ""
    n = held["count"]
    fig = (f"median of {n}: min {spread['min']:.1f}, max {spread['max']:.1f} dB" if n > 1
           else "one sample")
    where = held.get("on", "")
    if held.get("kind") in ("split", "unpicked"):
        where = f"{n} " + (where.replace("samples", "sample", 1) if n == 1 else where)
    inside = (m.get("in_sample") or {}).get("snr_db", {}).get("median")
    example = m.get("example_snr_db") if held.get("kind") != "example" else None
    cls = "wb-insample" if held.get("kind") == "calibration" else "wb-heldout"
    return (f"<span class='{cls}'>on {esc(where)} ({fig})</span>"
            + ("" if inside is None else
               f"; <span class='wb-insample-snr'>in-sample {inside:.1f} dB</span>")
            + ("" if example is None else
               f"; <span class='wb-example-snr'>on the example inputs {example:.1f} dB</span>"))


def _calibration_html(p: dict[str, Any]) -> str:
    cal = p.get("calibration") or {}
    if not cal:
        return ""
    pre = cal.get("preprocess")
    if pre and "fn" in pre:
        how = f"fn {pre['fn']}"
    elif pre:
        how = ", ".join(f"{k} {v}" for k, v in pre.items() if v not in (None, False))
    else:
        how = "none"
    return (f"<br>calibrated on {cal.get('count')} samples of {esc(cal.get('source', ''))}; "
            f"<span class='wb-prep'>preprocessing: {esc(how)}</span>")
