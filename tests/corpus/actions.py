"""What a case does in its child: the shared context, the entry points, the result checks.

Each family module registers ``KINDS`` (kind name -> ``prepare(ctx)``); ``prepare`` writes the
case's damaged inputs under ``ctx.inp`` and returns the action, a callable returning
``("ok" | "wrong", detail)`` once it has checked the result against what is right. An action
that raises is classified by the harness (hinted / unhinted / foreign).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Action = Callable[[], tuple[str, str]]


class Context:
    def __init__(self, base: Path, cd: Path, case: dict[str, Any]) -> None:
        self.base = base
        self.cd = cd
        self.inp = cd / "in"
        self.ws_path = cd / "ws"
        self.case = case
        self.p: dict[str, Any] = case["params"]
        self.index = json.loads((base / "index.json").read_text())
        self._ws: Any = None

    @property
    def ws(self) -> Any:
        if self._ws is None:
            import workbench as wb

            self._ws = wb.Workspace(self.ws_path)
        return self._ws

    def model(self, name: str) -> Path:
        return self.base / "models" / name

    def copy_in(self, name: str, as_name: str | None = None) -> Path:
        dst = self.inp / (as_name or name)
        shutil.copy2(self.model(name), dst)
        return dst

    def ref(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        d = np.load(self.base / ("ref.npz" if which == "tiny" else "mlp_ref.npz"))
        return d["x"], d["y"]

    def ws_artifact_path(self, key: str) -> Path:
        art_id = self.index[key]
        main = self.index["onnx_main" if key == "onnx_id" else "ncnn_main"]
        return self.ws_path / art_id / main


def input_name(which: str) -> str:
    return "input" if which == "tiny" else "x"


# -- checks ---------------------------------------------------------------------------------
def close(got: Any, truth: np.ndarray, atol: float = 1e-4, what: str = "") -> tuple[str, str]:
    got = np.asarray(got)
    if got.shape != truth.shape:
        if got.size == truth.size and got.squeeze().shape == truth.squeeze().shape:
            got = got.reshape(truth.shape)
        else:
            return "wrong", f"{what} shape {got.shape}, expected {truth.shape}"
    if got.dtype == object or not np.issubdtype(got.dtype, np.number):
        return "wrong", f"{what} dtype {got.dtype}"
    if not np.allclose(got.astype(np.float64), truth.astype(np.float64), atol=atol, rtol=1e-3,
                       equal_nan=True):
        err = np.nanmax(np.abs(got.astype(np.float64) - truth)) if got.size else 0.0
        return "wrong", f"{what} values differ (max abs {err:.3g})"
    return "ok", f"{what} matches ({got.shape})"


def first(out: dict[str, Any]) -> Any:
    if not out:
        return np.zeros((0,))
    return next(iter(out.values()))


def onnx_truth(path: Path, which: str, ctx: Context) -> np.ndarray:
    """What a damaged ONNX file should compute: the original's output, unless the damage left
    the graph's structure as it was and only changed weights (then the damaged weights'
    output, by onnx's reference evaluator: any engine result is right if it equals that)."""
    x, y = ctx.ref(which)
    try:
        import onnx
        from onnx.reference import ReferenceEvaluator

        m = onnx.load(str(path), load_external_data=False)
        o = onnx.load(str(ctx.model(f"{which}.onnx")))
        same = ([(n.op_type, list(n.input), list(n.output), n.domain,
                  [a.SerializeToString() for a in n.attribute]) for n in m.graph.node]
                == [(n.op_type, list(n.input), list(n.output), n.domain,
                     [a.SerializeToString() for a in n.attribute]) for n in o.graph.node]
                and [(i.name, tuple(i.dims), i.data_type) for i in m.graph.initializer]
                == [(i.name, tuple(i.dims), i.data_type) for i in o.graph.initializer]
                and [i.SerializeToString() for i in m.graph.input]
                == [i.SerializeToString() for i in o.graph.input]
                and [i.SerializeToString() for i in m.graph.output]
                == [i.SerializeToString() for i in o.graph.output]
                and m.opset_import == o.opset_import)
        if same and m.SerializeToString() != o.SerializeToString():
            return ReferenceEvaluator(m).run(None, {input_name(which): x})[0]
    except Exception:  # noqa: BLE001 - unreadable: only the original's output is right
        pass
    return y


def run_onnx_entry(entry: str, path: Path, which: str, ctx: Context,
                   truth: np.ndarray | None = None) -> tuple[str, str]:
    """Take an ONNX file through one entry point and check what comes out."""
    import workbench as wb
    from workbench.runtime import NcnnRunner, OrtRunner

    x, y = ctx.ref(which)
    truth = y if truth is None else truth
    feed = {input_name(which): x}
    if entry == "ort":
        return close(first(OrtRunner(path).run(feed)), truth, what="ort output")
    if entry == "import":
        art = ctx.ws.import_file(path)
        return close(first(OrtRunner(art).run(feed)), truth, what="imported model's output")
    if entry == "simplify":
        art = wb.simplify(path, workspace=ctx.ws)
        return close(first(OrtRunner(art).run(feed)), truth, what="simplified output")
    if entry == "raise":
        art = wb.raise_ops(path, workspace=ctx.ws)
        return close(first(OrtRunner(art).run(feed)), truth, what="raised output")
    if entry == "to_ncnn":
        import torch

        art = wb.to_ncnn(path, (torch.from_numpy(x),), workspace=ctx.ws)
        return close(first(NcnnRunner(art).run((x,))), truth, atol=1e-3, what="ncnn output")
    raise ValueError(f"unknown entry {entry!r}")


def run_ncnn(param: Path, ctx: Context, inputs: Any = None, truth: Any = None,
             atol: float = 1e-3) -> tuple[str, str]:
    from workbench.runtime import NcnnRunner

    x, y = ctx.ref("tiny")
    out = NcnnRunner(param).run((x,) if inputs is None else inputs)
    return close(first(out), y if truth is None else truth, atol=atol, what="ncnn output")


# -- the registry ---------------------------------------------------------------------------
def _kinds() -> dict[str, Callable[[Context], Action]]:
    from . import ncnn_cases, onnx_cases, runtime_cases, selftest, ws_cases

    kinds: dict[str, Callable[[Context], Action]] = {}
    for mod in (onnx_cases, ncnn_cases, runtime_cases, ws_cases, selftest):
        kinds.update(mod.KINDS)
    return kinds


def prepare(ctx: Context) -> Action:
    return _kinds()[ctx.case["kind"]](ctx)
