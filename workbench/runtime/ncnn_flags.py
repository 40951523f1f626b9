"""What a precision asks of ncnn: the ``net.opt`` flags it sets, and what actually runs on a
target (a CPU without fp16 arithmetic runs fp16 storage with fp32 arithmetic; x86 runs few
layers in fp16 at all).

The flags must be set before ``load_param``: ncnn turns fp16 on by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..diagnostics import Diagnostic
from ..errors import InputError

# fp32: every fp16/bf16 feature off. fp16: ncnn's defaults, fp16 storage, packing and
# arithmetic (what a phone with ARMv8.2 runs). fp16-storage: fp16 storage and packing, fp32
# arithmetic. bf16: bf16 storage, fp16 off.
PRECISIONS = ("fp32", "fp16", "fp16-storage", "bf16")


@dataclass(frozen=True)
class NcnnFlags:
    """Exactly which of ncnn's precision features a run used.

    Attributes:
        precision: what was asked (one of ``PRECISIONS``).
        target: None for this machine's ncnn, else the ARM target's name.
        fp16_storage: blobs and weights held in fp16 (``use_fp16_storage``/``packed``).
        fp16_arithmetic: layers compute in fp16 (``use_fp16_arithmetic`` on a CPU that has
            it: ARMv8.2's asimdhp; x86 ncnn computes fp32 whatever is asked).
        bf16_storage: blobs and weights held in bf16.
        int8: the model holds int8 layers (``wb.quantize(..., backend="ncnn")``), run by
            ncnn's int8 kernels.
    """

    precision: str
    target: str | None
    fp16_storage: bool
    fp16_arithmetic: bool
    bf16_storage: bool
    int8: bool

    @property
    def label(self) -> str:
        """The precision as it ran: "fp32", "fp16 storage", "fp16 arithmetic", "bf16",
        with "int8" for an int8 model."""
        if self.fp16_arithmetic:
            base = "fp16 arithmetic"
        elif self.fp16_storage:
            base = "fp16 storage"
        else:
            base = "bf16" if self.bf16_storage else "fp32"
        return f"int8 ({base} elsewhere)" if self.int8 else base


def check_precision(precision: Any) -> str:
    if precision not in PRECISIONS:
        raise InputError(f"precision={precision!r} is not one of {PRECISIONS}",
                         "fp32 for accuracy checks; fp16 is what ncnn does by default (fp16 "
                         "storage and, on a CPU that has it, fp16 arithmetic); fp16-storage "
                         "keeps fp32 arithmetic")
    return precision


def options(precision: str) -> dict[str, bool]:
    """The ``net.opt`` settings of ``precision`` (set them before ``load_param``)."""
    fp16 = precision in ("fp16", "fp16-storage")
    return {"use_fp16_storage": fp16, "use_fp16_packed": fp16,
            "use_fp16_arithmetic": precision == "fp16",
            "use_bf16_storage": precision == "bf16"}


def flags(precision: str, arithmetic_fp16: bool, int8: bool,
          target: str | None = None) -> NcnnFlags:
    """What runs when ``precision`` is asked of a CPU that has fp16 arithmetic or not."""
    opt = options(precision)
    return NcnnFlags(precision, target, opt["use_fp16_storage"],
                     opt["use_fp16_arithmetic"] and arithmetic_fp16,
                     opt["use_bf16_storage"], int8)


def instead(asked: NcnnFlags, where: str) -> Diagnostic | None:
    """A warning when fp16 arithmetic was asked of a CPU without it: what runs instead."""
    if asked.precision != "fp16" or asked.fp16_arithmetic:
        return None
    return Diagnostic(
        "warning", "fp16-arithmetic-unavailable",
        f"precision='fp16' asks for fp16 arithmetic, which {where} lacks: ncnn runs fp16 "
        "storage with fp32 arithmetic instead (what an ARMv8.0 phone such as a Cortex-A53/"
        "A72 one does)",
        "for fp16 arithmetic as ARMv8.2 phones run it, use target='arm64-v8.2'; "
        "precision='fp16-storage' says plainly what runs here")
