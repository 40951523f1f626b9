"""Repro: the diverging op as a one-node ONNX model, its reference inputs, the expected
output, and a script that prints the error, for a bug report or a backend's authors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .candidates import Candidate
    from .report import CompareReport, Record

SCRIPT = '''"""Reproduces {op_type} node {node!r} ({reference}) from {candidate}.
Run: python repro.py   (needs numpy and onnxruntime)"""
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

here = Path(__file__).parent
names = json.loads((here / "inputs.json").read_text())
feeds = {{name: np.load(here / file) for name, file in names.items()}}
session = ort.InferenceSession(str(here / "model.onnx"), providers=["CPUExecutionProvider"])
got = session.run([{output!r}], feeds)[0]
expected = np.load(here / "expected.npy")
diff = np.abs(got.astype(np.float64) - expected.reshape(got.shape).astype(np.float64))
print(f"{op_type} {node}: max abs {{diff.max():.6g}}, mean abs {{diff.mean():.6g}} "
      f"(recorded in the comparison: {max_abs:.6g})")
'''


def _file(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "tensor"


def write_repro(report: CompareReport, cand: Candidate, record: Record, folder: Path) -> Path:
    """The repro of ``record`` (a tensor of the ONNX candidate ``cand``) in ``folder``:
    model.onnx (its node alone), inputs/*.npy (aligned inputs from the reference, as in
    isolated mode), expected.npy and repro.py. Returns the folder."""
    import json

    import onnx
    from onnx import helper

    from ..onnx_io import load_onnx
    from .isolated import fit_reference

    model = load_onnx(cand.path)
    node = next((n for n in model.graph.node if record.name in n.output), None)
    if node is None:
        from ..errors import InputError

        raise InputError(f"{record.name!r} is not produced by any node of {cand.path.name}",
                         "pass a record of this candidate (report.first_divergence)")
    pairs = report.alignments[cand.name].pairs
    ref_values = report.reference.run(report.inputs, capture="all")
    values = cand.runner.run(report.inputs, capture="all")
    values.update(cand.runner.feed(report.inputs))
    inits = {t.name: t for t in model.graph.initializer}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "inputs").mkdir(exist_ok=True)
    graph_inputs, initializers, files = [], [], {}
    for name in node.input:
        if not name or name in files:
            continue
        if name in inits:
            initializers.append(inits[name])
            continue
        arr = np.asarray(values[name])
        if name in pairs:  # fed from the reference, as in isolated mode
            arr = fit_reference(ref_values[pairs[name]], arr.shape).astype(arr.dtype, copy=False)
        rel = f"inputs/{_file(name)}.npy"
        np.save(folder / rel, np.ascontiguousarray(arr))
        files[name] = rel
        graph_inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    out = np.asarray(values[record.name])
    outputs = [helper.make_tensor_value_info(
        record.name, helper.np_dtype_to_tensor_dtype(out.dtype), list(out.shape))]
    graph = helper.make_graph([node], f"repro_{_file(node.name or node.op_type)}", graph_inputs,
                              outputs, initializer=initializers)
    mini = helper.make_model(graph, opset_imports=list(model.opset_import))
    mini.ir_version = model.ir_version
    mini.functions.extend(f for f in model.functions if f.name == node.op_type)
    onnx.checker.check_model(mini)
    onnx.save(mini, str(folder / "model.onnx"))
    expected = fit_reference(ref_values[record.reference], out.shape)
    np.save(folder / "expected.npy", np.ascontiguousarray(expected))
    (folder / "inputs.json").write_text(json.dumps(files, indent=2))
    (folder / "repro.py").write_text(SCRIPT.format(
        op_type=node.op_type, node=node.name or record.name, reference=record.reference,
        candidate=cand.name, output=record.name, max_abs=record.metrics.max_abs))
    return folder
