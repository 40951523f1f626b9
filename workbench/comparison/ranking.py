"""What a sensitivity ranking says (``comparison/sensitivity.py`` measures it): each
low-precision layer's cost (``Sensitivity``), the model input's own rounding
(``InputRounding``), which candidate was ranked among the comparison's low-precision ones
(``Choice``), and the ``Ranking`` that holds them, most costly first, with a summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ranked", "unmeasurable", "float")


@dataclass
class Sensitivity:
    """One layer's cost: ``final_snr_db`` is the model output's SNR (the worst output) when
    only this layer's isolated error is let into a float run (None: not measured);
    ``isolated_snr_db`` the layer's own SNR on reference inputs; ``status`` "ranked" (ran in
    low precision, measured), "unmeasurable" (ran in low precision, its value cannot be put
    back into the torch run: ``reason`` says why) or "float" (ran in fp32: not ranked);
    ``precision`` what its own computation ran in (int8, fp16, bf16, fp32); ``reason`` what
    ran, or why it is not measured."""

    record: Any  # the isolated Record (``.reference`` is the module call)
    final_snr_db: float | None
    isolated_snr_db: float
    # ncnn int8: the layers whose rounding of this record's tensor (ncnn rounds a blob
    # inside each int8 layer that reads it) is counted here rather than against them
    via: tuple[str, ...] = ()
    status: str = "ranked"
    precision: str = "int8"
    reason: str = ""

    @property
    def reference(self) -> str:
        return self.record.reference


@dataclass
class InputRounding:
    """The loss of the model input rounded to low precision by the layers that read it:
    ``final_snr_db`` (the output's SNR when only the input is rounded), ``isolated_snr_db``
    (the rounded input's own SNR), ``inputs`` and ``readers`` by the candidate's names."""

    inputs: tuple[str, ...]
    readers: tuple[str, ...]
    final_snr_db: float
    isolated_snr_db: float

    def line(self) -> str:
        readers = ", ".join(self.readers[:4]) + (" ..." if len(self.readers) > 4 else "")
        return (f"input rounding: {self.final_snr_db:.1f} dB (input {', '.join(self.inputs)} "
                f"rounded to int8 by {readers}, {self.isolated_snr_db:.1f} dB on its own; no "
                "layer's error, so no layer is ranked for it)")


@dataclass
class Choice:
    """Which candidate a ranking ranks, among the comparison's low-precision candidates:
    ``outputs`` {candidate: its worst output's SNR in dB} (``by`` "output"; "worst tensor"
    when some candidate's output was not aligned: each one's worst accumulated tensor
    instead), ``worst`` the candidate ``rep.sensitivity()`` ranks by default."""

    outputs: dict[str, float] = field(default_factory=dict)
    by: str = "output"
    worst: str = ""

    def line(self, ranked: str) -> str:
        """What was ranked and why, in a line."""
        if len(self.outputs) < 2:
            return f"ranked: {ranked}"
        figures = ", ".join(f"{n} {v:.1f} dB" for n, v in sorted(
            self.outputs.items(), key=lambda kv: kv[1]))
        how = (f"the worst {self.by} of the {len(self.outputs)} low-precision candidates "
               if ranked == self.worst else
               f"as asked, not the worst {self.by} (rep.sensitivity() ranks {self.worst}) ")
        return f"ranked: {ranked}, {how}({self.by} SNR: {figures})"


class Ranking(list):
    """The measured low-precision layers, most costly first (a list of Sensitivity:
    ``rep.sensitive(k)`` takes the first k), with what is not ranked beside it:
    ``unmeasurable`` and ``floats`` (Sensitivity entries with the reason), and
    ``input_rounding`` (None when the model input is not rounded). ``candidate`` is the
    candidate ranked and ``choice`` (a Choice) why it, among the comparison's low-precision
    candidates; ``seconds`` what each step of the ranking took. ``summary()`` says it all
    in lines."""

    def __init__(self, ranked: list[Sensitivity] = (), *, candidate: str = "",
                 precision: str = "", unmeasurable: list[Sensitivity] = (),
                 floats: list[Sensitivity] = (), input_rounding: InputRounding | None = None
                 ) -> None:
        super().__init__(ranked)
        self.candidate, self.precision = candidate, precision
        self.unmeasurable, self.floats = list(unmeasurable), list(floats)
        self.input_rounding = input_rounding
        self.choice = Choice()
        self.seconds: dict[str, float] = {}

    def summary(self, top: int = 10) -> str:
        """The ranking in lines: which candidate, the top layers, the input rounding, what is
        not ranked."""
        out = [self.choice.line(self.candidate),
               f"{self.candidate}: {len(self)} {self.precision} layers ranked by what their "
               "own error costs the output (final-output SNR, most costly first)"]
        for i, s in enumerate(self[:top], 1):
            via = f", via {', '.join(s.via)}" if s.via else ""
            out.append(f"  {i}. {s.reference} [{s.record.node or s.record.name}{via}]: "
                       f"{s.final_snr_db:.1f} dB (own {s.isolated_snr_db:.1f} dB)")
        if self.input_rounding is not None:
            out.append(self.input_rounding.line())
        for s in self.unmeasurable:
            out.append(f"unmeasurable: {s.reference} [{s.record.node or s.record.name}] "
                       f"(own {s.isolated_snr_db:.1f} dB): {s.reason}")
        if self.floats:
            names = ", ".join(f"{s.reference} [{s.record.node}]" for s in self.floats[:8])
            out.append(f"float, not ranked: {len(self.floats)} layers ran in fp32: {names}"
                       + (" ..." if len(self.floats) > 8 else ""))
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<Ranking of {self.candidate}>\n{self.summary(top=5)}"
