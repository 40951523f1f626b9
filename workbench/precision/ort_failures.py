"""onnxruntime's quantizer run with its log captured, and its own failures named.

``run_ort`` runs one call of ``onnxruntime.quantization`` and turns an exception raised
inside it into a QuantizationError. When the traceback passes through a place onnxruntime is
known to fail at (``KNOWN``), the hint names the option that avoids it, checked on the
locked onnxruntime (1.32): a per-channel quantization of a Gemm whose bias is a row
``(1, N)`` (``torch.addmm(bias_row, x, w.t())`` exports so) fails in
``QDQQuantizer._adjust_weight_scale_for_int32_bias``, which reads the bias as one value per
output channel ("The truth value of an array with more than one element is ambiguous");
``per_channel=False`` takes the per-tensor branch, which reduces the bias to its absmax
and works. Any other failure keeps the general hint.
"""

from __future__ import annotations

import contextlib
import io
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, QuantizationError

GENERAL_HINT = ("run onnxruntime.quantization.quant_pre_process on the model and check it "
                "loads in onnxruntime; exclude the node the error names, or narrow op_types")


@dataclass(frozen=True)
class KnownFailure:
    """A place inside onnxruntime's quantizer that fails on some models: ``where`` (the
    function the traceback passes through), ``when`` (the option that leads there, as
    ``quantize_static_qdq`` was called: {name: value}), ``option`` (what avoids it) and
    ``why`` (what onnxruntime does there)."""

    where: str
    when: tuple[tuple[str, Any], ...]
    option: str
    why: str


KNOWN = (
    KnownFailure("_adjust_weight_scale_for_int32_bias", (("per_channel", True),),
                 "per_channel=False",
                 "onnxruntime's per-channel check of int32 bias scales "
                 "(_adjust_weight_scale_for_int32_bias) reads the bias as one value per "
                 "output channel"),
)


def known_failure(error: BaseException, context: dict[str, Any]) -> KnownFailure | None:
    """The KNOWN failure ``error`` (raised inside onnxruntime, with ``context`` the options
    it was called with) is, or None."""
    frames = {f.name for f in traceback.extract_tb(error.__traceback__)}
    for known in KNOWN:
        if known.where in frames and all(context.get(k) == v for k, v in known.when):
            return known
    return None


def odd_biases(model: Any) -> list[tuple[str, str, list[int]]]:
    """(node, bias, shape) of each Conv/ConvTranspose/Gemm whose bias initializer is not one
    value per output channel (a row (1, N), a scalar): what the per-channel bias check trips
    on."""
    if model is None:
        return []
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(n.input) < 3:
            continue
        bias = inits.get(n.input[2])
        if bias is not None and len(bias.dims) != 1:
            out.append((n.name, n.input[2], list(bias.dims)))
    return out


def failure_hint(error: BaseException, context: dict[str, Any]) -> str:
    """The hint for ``error``: the option that avoids a KNOWN failure, else GENERAL_HINT."""
    known = known_failure(error, context)
    if known is None:
        return GENERAL_HINT
    hint = f"{known.option} avoids it: {known.why}"
    odd = odd_biases(context.get("model")) if known.option == "per_channel=False" else []
    if odd:
        hint += ", and " + "; ".join(f"{n}'s bias {b!r} has shape {shape}"
                                     for n, b, shape in odd[:3])
        hint += f"; or keep {'those nodes' if len(odd) > 1 else odd[0][0]} float: " \
                f"exclude={[n for n, _, _ in odd[:3]]}"
    return hint


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_ort(what: str, src: Path, call: Any, context: dict[str, Any] | None = None
            ) -> list[str]:
    """Run onnxruntime's quantizer; its exceptions become a QuantizationError naming it (the
    hint from ``failure_hint``; ``context``: the options it was called with and the
    ``model``). Its warnings (logged on the root logger) are returned instead of printed;
    the calibrators' print() lines ("Collecting tensor data ...") are dropped: the progress
    bar says the same."""
    root = logging.getLogger()
    handler, saved = _Lines(), root.handlers[:]
    root.handlers[:] = [handler]  # while quantizing only: ORT's lines go to the result
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            call()
        return handler.lines
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime raises plain exceptions of any kind
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise QuantizationError(f"onnxruntime's {what} failed on {src.name}: "
                                f"{type(e).__name__}: {first}",
                                failure_hint(e, context or {})) from e
    finally:
        root.handlers[:] = saved
