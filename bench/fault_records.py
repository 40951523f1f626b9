"""What ``bench/faults.py`` records: one ``Trial`` per fault put into a candidate, one
``Clean`` per clean comparison of a candidate, and the causes that keep a trial out of
hits / trials.

A trial not blamed on its module is a miss (``fault_causes.miss_cause`` guesses why), unless
it was not run (``NOT_RUN``) or its fault is invisible on its candidate
(``fault_visibility.INVISIBLE``); neither is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import fault_visibility as visibility

UNBUILT = "candidate could not be built"
# the candidate's clean run crashed or failed (wb.compare says so: report.failed): a true
# verdict, not a false alarm (Clean.failed); its trials are not counted, as an unbuilt
# candidate's
RUN_FAILED = "candidate's run failed"
# the clean candidate's outputs are off in a plain run (Clean.explained): a fault put in
# would be named after a divergence already there; its trials are not counted either
DEVIATES = "clean candidate deviates"
# no module's weight is in the candidate as any relation the bench knows (BiT's
# weight-standardised convolutions: the weight used is computed in forward, and a
# simplified graph holds only that): no fault can be put in, so no trial
NO_WEIGHT = "no weight of the model found in the candidate"
NOT_RUN = (UNBUILT, RUN_FAILED, DEVIATES, NO_WEIGHT)


@dataclass
class Trial:
    model: str
    kind: str
    depth: int  # index among the model's weighted modules that was asked for
    strength: float = 1.0  # --strength: the noise's multiple of the damage's 10%
    damage: str = "relative"  # --damage: "relative" or "max"
    module: str = ""
    module_type: str = ""
    substitute_for: str = ""  # the module asked for, when its weight could not be found
    store: str = ""
    relation: str = ""
    edited: int = 0
    offset: int = -1
    verified: str = ""  # "yes" or what changed first instead
    torch_effect: float = 0.0
    hit: bool = False
    hit_accumulated: bool = False
    named: dict[str, Any] | None = None
    named_accumulated: dict[str, Any] | None = None
    # no divergence named, but wb.compare says where the error comes from
    # (CompareReport.error_sources): reported beside a miss, not counted as a hit
    source: dict[str, Any] | None = None
    source_blames: bool = False
    own: list[dict[str, Any]] = field(default_factory=list)  # records naming the module
    reader_op: str = ""  # the op type(s) reading the weight
    reader: str = ""  # how the tensor(s) of the op reading the weight were placed
    reader_clean: str = ""  # the same, in the clean comparison
    aligned_fraction: float = 0.0
    # the fault's largest effect on a candidate tensor over its tolerance (fault_visibility)
    effect: str = ""
    cause: str = ""
    error: str = ""
    seconds: float = 0.0


@dataclass
class Clean:
    model: str
    kind: str
    false_alarm: bool = False
    ok: bool = True
    summary: str = ""  # the report's summary line, kept for a false alarm
    named: dict[str, Any] | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    failed: str = ""  # why its run failed (report.failed): not a false alarm, not counted
    # the report's note naming the divergence's layer as computing another formula than its
    # module (ncnn's erf GELU for a tanh GELU), or its verdict naming an output that is not
    # torch's, which a plain run confirms: a true deviation, named; not a false alarm
    explained: str = ""
    deviates: bool = False  # a plain run shows the outputs off: its trials are not counted



def counted(t: Trial) -> bool:
    """A trial counted in hits / trials: it ran, and its fault is visible on its candidate."""
    return t.cause not in NOT_RUN and t.cause != visibility.INVISIBLE


def first_line(e: BaseException) -> str:
    """An error's message, its first line, at most 300 characters: what a note or a record
    keeps of it."""
    text = getattr(e, "message", None) or str(e)
    return (text.strip().splitlines() or [type(e).__name__])[0][:300]
