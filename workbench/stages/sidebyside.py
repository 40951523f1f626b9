"""The PNNX side-by-side: one model seen at every level of raising, with op counts.

For a torch model and its example inputs: the PyTorch ops as written (leaf modules and
functional calls, recorded by ``TorchRunner(capture="all")``), PNNX's own raising (its
``.pnnx.param`` graph and the ``_pnnx.py`` code it regenerates), the raw ONNX export, the
simplified ONNX and the raised ONNX, each with its op histogram. The ratio to PyTorch's
count says how far each level is from the model as its author wrote it.
"""

from __future__ import annotations

import html
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..errors import ConversionError, InputError, WorkbenchError
from ..params import PNNX_IO_OPS, parse_pnnx_param
from ..runtime.torch_runner import TorchRunner
from .export import export
from .ncnn import to_ncnn
from .simplify import simplify as run_simplify

LEVELS = ("torch", "pnnx", "onnx", "simplified", "raised")


@dataclass
class Level:
    """One column: a level of the model, its op count and histogram, and where it came from."""

    name: str  # one of LEVELS
    what: str  # how it was produced, in a few words
    op_histogram: dict[str, int]
    ops: list[str] = field(default_factory=list)  # op types in order (torch and pnnx)
    artifact: Artifact | None = None

    @property
    def count(self) -> int:
        return sum(self.op_histogram.values())


@dataclass
class SideBySide:
    """Every level of one model, side by side; ``table()`` rows, ``text()``, HTML in Jupyter."""

    levels: dict[str, Level] = field(default_factory=dict)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)
    pnnx_code: str = ""  # the _pnnx.py pnnx regenerates: the model as pnnx reads it
    pnnx_param: str = ""  # the .pnnx.param text
    seconds: float = 0.0

    def count(self, level: str) -> int | None:
        """Op count at ``level`` (None when that level failed or was skipped)."""
        return self.levels[level].count if level in self.levels else None

    def ratio(self, level: str, to: str = "pnnx") -> float | None:
        """Op count at ``level`` divided by the count at ``to`` (PNNX's by default)."""
        a, b = self.count(level), self.count(to)
        return None if a is None or not b else a / b

    def table(self) -> list[dict[str, Any]]:
        """One record per level: level, what, ops, ratio to torch and to pnnx, top ops."""
        rows = []
        for name in LEVELS:
            if name in self.levels:
                lv = self.levels[name]
                top = ", ".join(f"{k} {v}" for k, v in list(lv.op_histogram.items())[:5])
                rows.append({"level": name, "what": lv.what, "ops": lv.count,
                             "vs_torch": _round(self.ratio(name, "torch")),
                             "vs_pnnx": _round(self.ratio(name, "pnnx")), "top_ops": top,
                             "artifact": lv.artifact.id if lv.artifact else None})
            elif name in self.errors:
                rows.append({"level": name, "what": "failed", "ops": None, "vs_torch": None,
                             "vs_pnnx": None, "top_ops": _first(self.errors[name]),
                             "artifact": None})
        return rows

    def histograms(self) -> dict[str, dict[str, int]]:
        """{level: {op type: count}} for every level that ran."""
        return {n: dict(lv.op_histogram) for n, lv in self.levels.items()}

    def text(self, top: int = 12) -> str:
        """The counts, then each level's histogram in its own column (``top`` ops each)."""
        rows = [("level", "what", "ops", "x torch", "x pnnx")]
        for r in self.table():
            rows.append((r["level"], r["what"] if r["ops"] is not None else
                         f"failed: {r['top_ops']}"[:70],
                         "-" if r["ops"] is None else str(r["ops"]),
                         _fmt(r["vs_torch"]), _fmt(r["vs_pnnx"])))
        lines = _columns(rows, right=(2, 3, 4))
        names = [n for n in LEVELS if n in self.levels]
        cols = [[f"{n} ({self.levels[n].count})"]
                + [f"{k} {v}" for k, v in list(self.levels[n].op_histogram.items())[:top]]
                + ([f"... {len(self.levels[n].op_histogram) - top} more"]
                   if len(self.levels[n].op_histogram) > top else [])
                for n in names]
        depth = max((len(c) for c in cols), default=0)
        grid = [tuple(c[i] if i < len(c) else "" for c in cols) for i in range(depth)]
        if grid:
            lines += ["", *_columns(grid)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("level", "what", "ops", "× torch", "× pnnx"))
        body = "".join(
            f"<tr><td>{r['level']}</td><td>{html.escape(str(r['what']))}</td>"
            f"<td style='text-align:right'>{'-' if r['ops'] is None else r['ops']}</td>"
            f"<td>{_fmt(r['vs_torch'])}</td><td>{_fmt(r['vs_pnnx'])}</td></tr>"
            for r in self.table())
        names = [n for n in LEVELS if n in self.levels]
        hists = "".join(
            "<td style='vertical-align:top'><pre style='margin:0'>" + html.escape("\n".join(
                f"{k} {v}" for k, v in self.levels[n].op_histogram.items())) + "</pre></td>"
            for n in names)
        heads = "".join(f"<th>{n} ({self.levels[n].count})</th>" for n in names)
        code = (f"<details><summary>pnnx's regenerated Python (_pnnx.py)</summary><pre>"
                f"{html.escape(self.pnnx_code)}</pre></details>" if self.pnnx_code else "")
        return (f"<table><tr>{head}</tr>{body}</table><table><tr>{heads}</tr><tr>{hists}</tr>"
                f"</table>{code}")


def side_by_side(
    model: Any,
    inputs: Any,
    *,
    workspace: Workspace | str | None = None,
    exporter: str = "torchscript",
    opset: int = 17,
    simplify: str = "onnxslim",
    rules: Any = None,
    target: str = "standard",
    onnx: Artifact | None = None,
    pnnx: bool = True,
    progress: bool = True,
) -> SideBySide:
    """Run ``model`` through torch capture, pnnx, export, simplify and raise; every level's op
    count and histogram in one ``SideBySide``.

    ``onnx`` reuses an export already made (its parent model must be ``model``); ``pnnx=False``
    skips the pnnx conversion. A level that fails is recorded in ``errors`` and the others
    still run.
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    _check_model_and_onnx(model, onnx)
    ws = onnx.workspace if workspace is None and onnx is not None else as_workspace(workspace)
    how = _How(exporter, opset, simplify, rules, target, onnx)
    out = SideBySide()
    steps = ["torch", "pnnx", "onnx", "simplified", "raised"] if pnnx else \
        ["torch", "onnx", "simplified", "raised"]
    bar = tqdm(steps, desc="side by side", disable=not progress, leave=False)
    needs = {"simplified": "onnx", "raised": "simplified"}
    for step in bar:
        bar.set_postfix_str(step)
        if step in needs and needs[step] not in out.levels:
            continue  # the level it builds on failed: its error is recorded
        try:
            _add_level(out, step, model, inputs, ws, how)
        except WorkbenchError as e:
            out.errors[step] = e
    out.seconds = time.perf_counter() - t0
    return out


def _check_model_and_onnx(model: Any, onnx: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InputError(f"side_by_side needs an nn.Module, got {type(model).__name__}",
                         "wb.side_by_side(model, (x,))")
    if onnx is not None and (not isinstance(onnx, Artifact) or onnx.format != "onnx"):
        raise InputError(f"onnx= must be an ONNX Artifact from wb.export, got "
                         f"{getattr(onnx, 'format', type(onnx).__name__)}",
                         "pass the artifact wb.export returned, or leave onnx=None")


@dataclass(frozen=True)
class _How:
    """How the ONNX levels are made (side_by_side's settings)."""

    exporter: str
    opset: int
    simplify: str
    rules: Any
    target: str
    onnx: Artifact | None


def _add_level(out: SideBySide, step: str, model: Any, inputs: Any, ws: Workspace,
               how: _How) -> None:
    """Make the level ``step`` (one of LEVELS) into ``out``; raises what its stage raises."""
    if step == "torch":
        out.levels["torch"] = _torch_level(model, inputs)
    elif step == "pnnx":
        out.levels["pnnx"], out.pnnx_param, out.pnnx_code = _pnnx_level(model, inputs, ws)
    elif step == "onnx":
        onx = how.onnx or export(model, inputs, workspace=ws, exporter=how.exporter,
                                 opset=how.opset)
        made = f"{onx.params.get('exporter', 'imported')} opset {onx.params.get('opset')}"
        out.levels["onnx"] = _onnx_level("onnx", onx, f"wb.export {made}")
    elif step == "simplified":
        sim = run_simplify(out.levels["onnx"].artifact, backend=how.simplify)
        out.levels["simplified"] = _onnx_level("simplified", sim,
                                               f"wb.simplify {how.simplify}")
    else:
        raise_ops = _raise_ops()
        hi = raise_ops(out.levels["simplified"].artifact, rules=how.rules, target=how.target)
        out.levels["raised"] = _onnx_level("raised", hi, f"wb.raise_ops {how.target}")


def _raise_ops() -> Any:
    # imported here, not at the top: a raising stage that cannot be imported (a partial
    # install or checkout) fails its level only; the other levels still count
    try:
        from .raising import raise_ops
    except ImportError as e:
        raise WorkbenchError(f"the raising stage cannot be imported: {e}",
                             "reinstall deploy-workbench") from e
    return raise_ops


def _onnx_level(name: str, art: Artifact, what: str) -> Level:
    return Level(name, what, dict(art.graph.op_histogram), artifact=art)


def torch_ops(model: Any, inputs: Any) -> list[tuple[str, str]]:
    """(name, op type) of each PyTorch op the forward pass ran as written: leaf modules
    (``nn.Conv2d``) and functional calls outside them (``F.gelu``, ``Tensor.view``, ``torch.cat``),
    in the order they ran."""
    modules = dict(model.named_modules())
    records = TorchRunner(model).run(inputs, capture="all")
    ops: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key in records:
        base = key if key in modules else re.sub(r"\.\d+$", "", key)
        if base in seen:  # one op with several tensor outputs
            continue
        if base in modules and base:
            seen.add(base)
            ops.append((base, _module_type(modules[base])))
            continue
        call = base.rsplit("/", 1)[-1]
        m = re.fullmatch(r"(.+)_(\d+)", call)
        if m is None or not m.group(1).startswith(("F.", "Tensor.", "torch.")):
            continue  # a model output (output_0), not an op
        seen.add(base)
        ops.append((base, m.group(1)))
    return ops


def _module_type(module: Any) -> str:
    cls = type(module)
    return f"nn.{cls.__name__}" if cls.__module__.startswith("torch.nn") else cls.__name__


def _histogram(types: list[str]) -> dict[str, int]:
    return dict(Counter(types).most_common())


def _torch_level(model: Any, inputs: Any) -> Level:
    ops = [t for _, t in torch_ops(model, inputs)]
    return Level("torch", "leaf modules + functional calls", _histogram(ops), ops=ops)


def _pnnx_level(model: Any, inputs: Any, ws: Workspace) -> tuple[Level, str, str]:
    before = {a.id for a in ws}
    failed = ""
    try:
        art = to_ncnn(model, inputs, workspace=ws).parent
    except ConversionError as e:
        # pnnx's own graph is what this level shows; when only its ncnn output has layers
        # ncnn cannot load, the pnnx artifact was kept: count it and say what failed
        kept = [a for a in ws if a.stage == "pnnx" and a.id not in before]
        if not kept:
            raise
        art = kept[-1]
        failed = f"; the ncnn step failed: {_first(e)[:60]}"
    param = parse_pnnx_param(art.path)
    ops = [o.type for o in param.ops if o.type not in PNNX_IO_OPS]
    code_file = art.dir / art.path.name.replace(".pnnx.param", "_pnnx.py")
    code = code_file.read_text() if code_file.exists() else ""
    level = Level("pnnx", f"pnnx ({Path(art.path).name}{failed})", _histogram(ops), ops=ops,
                  artifact=art)
    return level, art.path.read_text(), code


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _first(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _columns(rows: list[tuple[str, ...]], right: tuple[int, ...] = ()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]
