"""Why a fault was not blamed on its module: a first guess for each miss of
``bench/faults.py``, printed with it (and counted by cause) so a miss reads as a finding.
"""

from __future__ import annotations

from typing import Any

from fault_records import Trial
from fault_verdict import names_module, reason_group


def miss_cause(trial: Trial, rep: Any, first: Any, clean_rep: Any, module: str,
               ref_order: list[str]) -> str:
    """A first guess at why the fault was not blamed on its module."""
    twice = any("#" in r.reference for r in rep.records if names_module(r.reference, module))
    tag = " (module called twice)" if twice else ""
    if trial.torch_effect < 1:
        return f"fault below tolerance in torch itself ({trial.torch_effect:.2g}x)"
    if not trial.verified.startswith("yes") and not trial.verified.startswith("not checked"):
        return f"edit not where expected: {trial.verified}"
    own = trial.own
    if first is None:
        if not own:
            return "no divergence named; no tensor aligned to the perturbed module" + tag
        return "no divergence named; the module's own tensor passed" + passed_why(trial) + tag
    clean_div = clean_rep.first_divergence if clean_rep is not None else None
    if clean_div is not None and clean_div.reference == first.reference:
        return "named the clean comparison's false alarm, ahead of the fault"
    where = ""
    if first.reference in ref_order:
        later = [r for r in ref_order if names_module(r, module)]
        if later:
            where = (" (a later module)" if ref_order.index(first.reference) >
                     ref_order.index(later[0]) else " (an earlier module)")
    if not own:
        reader = trial.reader.split(": ", 1)[-1]
        clean = trial.reader_clean.split(": ", 1)[-1]
        if reader.startswith("aligned to"):
            return (f"the {trial.reader_op} reading the weight is aligned to another module "
                    f"without covers (fused/folded); named {first.op_type}{where}{tag}")
        if reader.startswith("unaligned") and clean.startswith("aligned"):
            return (f"the faulty tensor lost its alignment (the value match failed; clean: "
                    f"aligned); named {first.op_type}{where}{tag}")
        if reader.startswith("unaligned"):
            return (f"the {trial.reader_op} reading the weight is never aligned "
                    f"({reason_group(reader)}); named {first.op_type}{where}{tag}")
        if reader.startswith("attributed"):
            return (f"the {trial.reader_op} reading the weight is attributed, not measured; "
                    f"named {first.op_type}{where}{tag}")
        return (f"no tensor aligned to the perturbed module ({reader}); named "
                f"{first.op_type}{where}{tag}")
    if all(o["passed"] for o in own):
        return (f"the module's own tensor passed{passed_why(trial)}; named "
                f"{first.op_type}{where}{tag}")
    return f"the module's tensor fails too, but an earlier record was named{where}{tag}"


def passed_why(trial: Trial) -> str:
    """Why the damaged module's own tensor passed, where the trial shows it: paired under a
    relation the clean comparison did not need (the fault taken for a folding), or the fault
    not reaching it (a fused op after the module absorbs it: a saturated sigmoid)."""
    def relation(status: str) -> str:  # the last balanced "(...)" of an aligned status
        if not status.startswith("aligned") or not status.endswith(")"):
            return "equal"
        depth = 0
        for i in range(len(status) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(status[i], 0)
            if depth == 0:
                return status[i + 1:-1]
        return "equal"

    reader = trial.reader.split(": ", 1)[-1]
    clean = trial.reader_clean.split(": ", 1)[-1]
    if reader.startswith("aligned") and relation(reader) != relation(clean):
        return (f" as '{relation(reader)}', a relation the clean comparison did not need "
                f"('{relation(clean)}'): the fault taken for a folding")
    worst = max((o["max_abs"] / o["tolerance"] for o in trial.own if o["tolerance"]),
                default=None)
    if worst is not None and worst < 1:
        return (f" (at {worst:.2g}x its tolerance: the fault hardly reaches it, "
                f"torch's module output moves {trial.torch_effect:.3g}x)")
    return ""

