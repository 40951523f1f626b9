"""Custom ops: one declaration carries an op through export, ONNX Runtime, ncnn and wb.compare.

Three routes, as the tutorials teach them:

- an ATen op the exporter has no conversion for at the chosen opset (``aten::asinh`` at opset
  9): ``register_symbolic("aten::asinh", lambda g, x: g.op("Asinh", x), opset=9)``. The
  function is written once, TorchScript style (``g.op(...)``); the TorchScript exporter gets it
  through ``torch.onnx.register_custom_op_symbolic`` and the dynamo exporter through a
  ``custom_translation_table`` entry that ``wb.export`` passes by itself (``_DynamoGraph``
  replays the same ``g.op`` calls as onnxscript ops);
- an op of your own (``torch.library``): ``@custom_op("mylib::my_add", mutates_args=())``
  defines the torch op (with its fake impl), its ONNX form for both exporters (a node
  ``my_add`` in domain ``mylib`` with the op's non-tensor arguments as attributes, or the
  lowering ``onnx=`` gives), an ONNX Runtime kernel and an ncnn layer. Without ``ort=`` /
  ``ncnn=`` both kernels call the torch implementation on the tensors, so a model runs and
  compares everywhere from the torch code alone;
- an ``autograd.Function`` with a ``symbolic`` staticmethod is the TorchScript exporter's own
  mechanism and needs nothing here (torch.export traces through ``forward``; declare the op
  with ``custom_op(..., onnx=...)`` to have one form for both exporters).

How the pieces reach the backends:

- ONNX Runtime: onnxruntime-extensions runs Python kernels (``onnx_op``), but only in its own
  domain ``ai.onnx.contrib`` and only with int, float and string attributes. So
  ``ort_model`` (called by ``runtime.ort_session.session``) rewrites, in memory, each node of a
  registered op into that domain, its list attributes into JSON strings; the file on disk
  keeps the ``mylib::my_add`` node other runtimes expect. (onnxruntime-extensions crashes
  freeing a session made before a later Python-op registration, so such sessions are pinned:
  ``track_session``.)
- ncnn: a Python ``ncnn.Layer`` registered with ``Net.register_custom_layer`` under the op's
  name (``mylib::my_add``), by ``register_ncnn_layers`` (called by NcnnRunner before
  ``load_param``). Attributes travel as ncnn param ids 0..n-1 in sorted name order, the torch
  ranks of the inputs and outputs as arrays at ids 28 and 29 (ncnn drops the batch axis;
  the layer puts it back before calling the torch code).
- the worker processes: runners run in a separate, persistent worker process that does not
  have the user's Python functions. They are shipped there pickled by value with cloudpickle
  (a function defined in a notebook cell lives in ``__main__`` and cannot be imported by
  another process; cloudpickle carries its code and the globals it reads, and pickles
  importable modules by reference). A runner whose model uses a registered op passes the
  pickled specs as a constructor keyword; the worker's twin installs them before it builds
  its session or net. When the functions cannot be pickled (a closure over a lock, an open
  file...), the runner runs in this process instead and warns (``CustomOpWarning``).
- pnnx: pnnx cannot take an unknown ONNX domain (its ONNX Runtime shape inference fails and
  the conversion dies or drops the node) and cannot load a TorchScript file that calls a
  Python-defined op. What it does keep, as one op with its inputs and outputs, is a call of a
  local ONNX function whose name starts with ``aten_`` (the form the dynamo exporter used for
  ATen ops): ``pnnx_prepare`` replaces each custom node by a call of its own function
  ``aten_wbcustom_<k>`` whose body only gives the outputs their shape and dtype (enough for
  pnnx's shape inference), pnnx writes it as layer ``aten::wbcustom_<k>``, and
  ``ncnn_finish`` renames that layer to ``mylib::my_add`` with its attributes. So
  ``wb.to_ncnn(onnx_artifact)`` of a model with custom ops gives an ncnn param with a named
  custom layer that NcnnRunner runs through the registered Python layer.

Modules: ``registry`` (declarations, checks, ``register_symbolic``), ``exporters`` (the
dynamo bridge and ``custom_op``), ``kernels`` (torch code on numpy arrays), ``ort`` (ONNX
Runtime), ``ncnn`` (Python layers), ``shipping`` (to the worker), ``hints`` (the calls that
fix a missing op). The pnnx stand-ins live beside the ncnn stage
(``workbench.stages.pnnx_customops``).
"""

from __future__ import annotations

from ..errors import CustomOpError
from .exporters import custom_op, translation_table
from .hints import missing_ncnn_hint, registration_hint
from .ncnn import is_custom_layer, register_ncnn_layers
from .ort import missing_ort_hint, ort_model, track_session
from .registry import (
    EXPORTERS,
    ORT_DOMAIN,
    CustomOp,
    CustomOpWarning,
    Symbolic,
    register_symbolic,
    registered_ops,
    registered_symbolics,
    symbolic_opsets,
    unregister,
)
from .shipping import for_worker, install

__all__ = [
    "EXPORTERS", "ORT_DOMAIN", "CustomOp", "CustomOpError", "CustomOpWarning", "Symbolic",
    "custom_op", "for_worker", "install", "is_custom_layer", "missing_ncnn_hint",
    "missing_ort_hint", "ort_model", "register_ncnn_layers", "register_symbolic",
    "registered_ops", "registered_symbolics", "registration_hint", "symbolic_opsets",
    "track_session", "translation_table", "unregister",
]
