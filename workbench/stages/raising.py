"""Raise stage: fold lowered ONNX subgraphs back into the ops the PyTorch code wrote.

Export lowers ``nn.GroupNorm`` to six nodes, GELU to five or nine, ``F.normalize`` to four.
``raise_ops`` applies the rules of ``workbench.rules`` (one per op family: an onnxscript
pattern, a check of its constants, the raised forms) with onnxscript's rewriter on an
onnx-ir model, so no subgraph matching is written here.

``target="standard"`` emits the standard ONNX op where the model's opset has it
(LayerNormalization 17, Gelu 20, GroupNormalization 21...; ``opset=`` upgrades the model
first with ``onnx.version_converter``); where it lacks the op, that rule falls back to the
function form with an info diagnostic naming the opset needed. ``target="functions"``
emits a local function named after the PyTorch op (domain ``pkg.workbench``) whose body is
the matched subgraph (onnxscript's ``RewriteRule(as_function=True)``): the graph reads
high-level in Netron and ONNX Runtime still runs it.

Every result is checked against its parent with ONNX Runtime (example inputs + random
feeds). If the raised model does not run or drifts beyond tolerance, the rules that fired
are tried again one at a time, each kept only if the model still matches; a rule dropped
this way gets a ``rule-disabled`` warning, so the artifact returned is always one that
matches its parent (with an error diagnostic only if even that fails, e.g. when the opset
upgrade itself changes the numbers). A rule whose check or builder raises is reported
(``rule-crashed``) and its matches are left alone; the other rules still run.

The report: ``RaiseReport.of(artifact)`` (``wb.RaiseReport.of(art)``) reads
``raise_report.json`` from the artifact (which rule fired where, node names before -> op
after, counts and op histograms, max abs/rel diff vs parent); the same figures are in
``artifact.metrics`` and so in manifest.json.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .. import rules as registry
from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..checks import compare_outputs, error_vs_torch, outputs_on, random_feeds, reference_data
from ..diagnostics import Diagnostic
from ..errors import InputError, RaiseError
from ..graph import GraphSummary, remember_summary, summarize, summarize_onnx
from ..onnx_io import load_onnx, lower_ir_version, mark_readable
from ..onnx_weights import checker_problem, save_with_external_data
from ..progress import Progress, Steps
from ..rules import Rule
from ..runtime.ort_runner import OrtRunner
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from .raise_report import REPORT, RaiseReport
from .rewrite import Firing, apply_rules
from .simplify import LARGE, as_onnx_artifact, has_external_data

MAIN = "model.onnx"
TARGETS = ("standard", "functions")


class _Attempt(NamedTuple):
    """One try of a set of rules: the raised model and what the try found."""

    model: Any
    firings: list[Firing]
    fallbacks: dict[str, int | None]  # rule -> the opset its standard op needs (None: cannot)
    vs_parent: dict[str, Any]  # the numeric check against the parent
    diagnostics: list[Diagnostic]
    outputs: list[Any]  # the raised model's outputs on each feed (or what it raised)


def raise_ops(
    source: Artifact | str | Path,
    *,
    rules: Any = None,
    target: str = "standard",
    workspace: Workspace | str | None = None,
    opset: int | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    progress: Progress = False,
) -> Artifact:
    """Raise lowered subgraphs to high-level ops; returns a new ``raise`` Artifact.

    Args:
        source: an ONNX Artifact or a path to a .onnx file.
        rules: None (every registered rule), or rule names / ``Rule`` objects.
        target: "standard" or "functions" (see the module docstring).
        workspace: where to write (default: the source artifact's workspace).
        opset: upgrade the model's ai.onnx opset first (e.g. 21 for GroupNormalization).
        atol, rtol: the tolerance of the before/after numeric check.
        seed: the seed of the check's random inputs.
        progress: True shows a bar through the phases (reading, onnxruntime on the input,
            the rules with their check, writing the report); a callable gets each
            ``workbench.progress.Step``; False shows nothing.

    Returns:
        A ``raise`` Artifact. The report is ``RaiseReport.of(artifact)``; its figures are
        also in ``artifact.metrics``.

    Raises:
        RaiseError: a rewrite broke the graph or changed the numbers (the source is kept).
    """
    t0 = time.perf_counter()
    chosen = _resolve_rules(rules)
    _check_target_and_opset(target, opset)
    parent = as_onnx_artifact(source, workspace, "raise_ops")
    ws = parent.workspace if workspace is None and parent.workspace else as_workspace(workspace)
    diags: list[Diagnostic] = []
    steps = Steps(progress, "raise", 4)
    steps.phase(f"reading {parent.path.name}")
    model, opset_before = _model_at(parent, opset, diags)
    opset_now = _default_opset(model)

    before = parent.graph
    ref = reference_data(parent)
    example = dict(ref[0]) if ref else None
    feeds = random_feeds(parent.graph, example, seed)
    # the parent runs once, its session then dropped: every try is checked against these
    steps.advance()
    steps.phase(f"running the input model in onnxruntime ({len(feeds)} feeds)")
    parent_outputs = outputs_on(OrtRunner(parent.path), feeds)

    with steps, ws.staging() as d:
        steps.advance()
        steps.phase(f"raising ({len(chosen)} rules), each try checked with onnxruntime")
        trial = _Trial(model, target, opset_now, d / MAIN, parent_outputs, feeds, atol, rtol,
                       has_external_data(parent))
        result, disabled = _raise_checked(trial, chosen, diags)
        diags.extend(result.diagnostics)
        diags += _fallback_diagnostics(result.fallbacks, chosen, opset_now)
        steps.advance()
        steps.phase("checking the raised model (onnx.checker) and writing the report")
        _check_model(result.model, diags)
        rel = _relative(result.vs_parent["max_abs"], parent_outputs)
        report = _write_report(trial, result, disabled, rel, before, opset_before)
        at = next((i for i, f in enumerate(feeds) if f is example), None)
        on_example = result.outputs[at] if at is not None else None
        metrics = {"max_abs": error_vs_torch(trial.path, ref, outputs=on_example), **_report_metrics(
            report, result.vs_parent["feeds"])}
        steps.advance()
        params = {"rules": [r.name for r in chosen], "target": target, "opset": opset,
                  "atol": atol, "rtol": rtol, "seed": seed}
        return ws.commit(d, stage="raise", format="onnx", main=MAIN, parent=parent,
                         params=params, seconds=time.perf_counter() - t0, diagnostics=diags,
                         metrics=metrics)


def _write_report(trial: _Trial, result: _Attempt, disabled: list[str], rel: float | None,
                  before: GraphSummary, opset_before: int | None) -> RaiseReport:
    """The RaiseReport of the last try, written as ``raise_report.json`` beside the model."""
    after = summarize(trial.path)
    report = RaiseReport(
        target=trial.target, opset_before=opset_before, opset_after=trial.opset,
        firings=result.firings, nodes_before=before.node_count,
        nodes_after=after.node_count, ops_before=before.op_histogram,
        ops_after=after.op_histogram, max_abs_vs_parent=result.vs_parent["max_abs"],
        max_rel_vs_parent=result.vs_parent["max_rel"], rel_vs_parent=rel,
        fallbacks=result.fallbacks, disabled=disabled)
    (trial.path.parent / REPORT).write_text(json.dumps(report.to_dict(), indent=1))
    return report


def _check_target_and_opset(target: str, opset: int | None) -> None:
    if target not in TARGETS:
        raise InputError(f"raise_ops target={target!r} is not one of {TARGETS}",
                         "use 'standard' (standard ONNX ops where the opset has them) or "
                         "'functions' (local functions named after the PyTorch ops)")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int)
                              or opset < 1):
        raise InputError(f"raise_ops opset={opset!r} is not a positive int",
                         "e.g. opset=21 (GroupNormalization) or leave it None")


def _model_at(parent: Artifact, opset: int | None, diags: list[Diagnostic]
              ) -> tuple[Any, int | None]:
    """The parent's model, upgraded to ``opset`` when one is given (an info diagnostic says
    so), and the opset it had."""
    model = load_onnx(parent.path)
    opset_before = _default_opset(model)
    if opset is not None and opset_before is not None and opset != opset_before:
        model = _upgrade(model, opset_before, opset, parent)
        diags.append(Diagnostic("info", "opset-upgraded",
                                f"ai.onnx opset {opset_before} -> {opset} "
                                "(onnx.version_converter) before raising"))
    return model, opset_before


@dataclass(frozen=True)
class _Trial:
    """Raising ``model`` with a set of rules into ``path``, checked against the parent."""

    model: Any
    target: str
    opset: int | None
    path: Path
    parent_outputs: list[Any]  # outputs_on the feeds
    feeds: list[Any]
    atol: float
    rtol: float
    external: bool = False  # write the weights as external data (the parent has them so)

    def run(self, rule_list: list[Rule]) -> _Attempt:
        raised, firings, fallbacks, errors = apply_rules(self.model, rule_list, self.target,
                                                         self.opset)
        lowered = lower_ir_version(raised)
        _save(raised, self.path, self.external)
        more = [Diagnostic("warning", "rule-crashed", f"rule {name!r}: {why}; its matches "
                           "were left as they were",
                           "fix the rule (or leave it out with rules=[...]); the other "
                           "rules ran") for name, why in errors.items()]
        if lowered:
            more.append(lowered)
        outputs = outputs_on(OrtRunner(self.path), self.feeds)
        vs, check_diags = compare_outputs(self.parent_outputs, outputs, self.feeds,
                                          "raise_ops", self.atol, self.rtol)
        return _Attempt(raised, firings, fallbacks, vs, more + check_diags, outputs)


def _raise_checked(trial: _Trial, chosen: list[Rule], diags: list[Diagnostic]
                   ) -> tuple[_Attempt, list[str]]:
    """Every chosen rule at once; when that breaks the model, the rules that fired tried
    again one at a time, each kept only if the model still matches its parent (a
    ``rule-disabled`` warning for the others). The last try and the rules disabled."""
    result = trial.run(chosen)
    disabled: list[str] = []
    if _broken(result.diagnostics) and result.firings and not _broken(trial.run([]).diagnostics):
        # Retry the rules that fired one at a time; keep each only if the model still
        # matches its parent. Bisecting would save runs, but a failure is rare and
        # this names the culprit exactly. (If even no rule at all breaks the model, the
        # opset upgrade did: no rule is blamed, the error diagnostic stays.)
        kept: list[Rule] = []
        fired = {f.rule for f in result.firings}
        for rule in chosen:
            if rule.name not in fired:
                continue
            one = trial.run([*kept, rule])
            if _broken(one.diagnostics):
                disabled.append(rule.name)
                why = next(x.message for x in one.diagnostics if x.level == "error")
                diags.append(Diagnostic(
                    "warning", "rule-disabled",
                    f"rule {rule.name!r} was disabled: with it the raised model does not "
                    f"match its parent ({why})",
                    f"raise_ops(..., rules=[...]) without {rule.name!r}; please report "
                    "the model (the rule's check let through a subgraph it should not)"))
            else:
                kept.append(rule)
        result = trial.run(kept)
    return result, disabled


def _fallback_diagnostics(fallbacks: dict[str, int | None], chosen: list[Rule],
                          opset_now: int | None) -> list[Diagnostic]:
    """An info diagnostic for each rule raised to the function form instead of its standard
    op (the opset lacks it, or some matches cannot be written as it)."""
    out = []
    for rule_name, needed in fallbacks.items():
        rule = next(r for r in chosen if r.name == rule_name)
        if needed is not None:
            out.append(Diagnostic(
                "info", "standard-op-needs-opset",
                f"{rule_name}: the standard op {rule.standard_op} needs ai.onnx opset "
                f"{needed}, the model has {opset_now}; raised to the function form "
                f"pkg.workbench::{rule_name} instead",
                f"wb.raise_ops(art, opset={needed}) upgrades the model first"))
        else:
            out.append(Diagnostic(
                "info", "standard-op-cannot-express",
                f"{rule_name}: some matches cannot be written as {rule.standard_op} (e.g. "
                "normalized axes it does not take, or unknown dims); they are raised to "
                f"the function form pkg.workbench::{rule_name}",
                "nothing to do; the function runs in ONNX Runtime as before"))
    return out


def _check_model(model: Any, diags: list[Diagnostic]) -> None:
    problem = checker_problem(model)  # on its structure: the weights are not serialized
    if problem is not None:
        diags.append(Diagnostic("error", "onnx-checker",
                                f"onnx.checker rejects the raised model: {problem}",
                                "please report the model; raise with fewer rules"))


def _report_metrics(report: RaiseReport, feeds_checked: Any) -> dict[str, Any]:
    """The report's figures, as the artifact's metrics (and so manifest.json) hold them."""
    return {
        "max_abs_vs_parent": report.max_abs_vs_parent,
        "max_rel_vs_parent": report.max_rel_vs_parent,
        "rel_vs_parent": report.rel_vs_parent, "feeds_checked": feeds_checked,
        "nodes_before": report.nodes_before, "nodes_after": report.nodes_after,
        "ops_before": report.ops_before, "ops_after": report.ops_after,
        "fired": report.counts, "fallbacks": report.fallbacks, "disabled": report.disabled,
    }


def _relative(max_abs: float | None, parent_outputs: list[Any]) -> float | None:
    """``max_abs`` over the largest magnitude of the parent's outputs on the first feed."""
    import numpy as np

    if max_abs is None or not parent_outputs or isinstance(parent_outputs[0], Exception):
        return None  # the check already said the parent does not run
    outs = parent_outputs[0]
    scale = max((float(np.abs(np.asarray(o, dtype=np.float64)).max()) for o in outs
                 if np.size(o)), default=0.0)
    return max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else None)


def _broken(diags: list[Diagnostic]) -> bool:
    return any(d.level == "error" for d in diags)


def _resolve_rules(rules: Any) -> list[Rule]:
    if rules is None:
        return registry.all_rules()
    if isinstance(rules, (str, Rule)):
        rules = [rules]
    try:
        items = list(rules)
    except TypeError:
        raise InputError(f"raise_ops rules= takes rule names or Rule objects, got "
                         f"{type(rules).__name__}", f"e.g. rules=['GELU', 'GroupNorm']; "
                         f"known: {registry.names()}") from None
    out: list[Rule] = []
    for item in items:
        if isinstance(item, Rule):
            out.append(item)
        elif isinstance(item, str):
            out.append(registry.get(item))
        else:
            raise InputError(f"raise_ops rules= takes rule names or Rule objects, got "
                             f"{type(item).__name__} {item!r}",
                             f"known rule names: {registry.names()}")
    return out


def _default_opset(model: Any) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _upgrade(model: Any, have: int, want: int, parent: Artifact) -> Any:
    """The model at ai.onnx opset ``want`` (onnx.version_converter; no downgrades)."""
    import onnx.version_converter

    if want < have:
        raise InputError(f"raise_ops opset={want} is below the model's opset {have} "
                         f"({parent.id}); raising only upgrades",
                         f"pass opset >= {have}, or None to keep {have}")
    try:
        return onnx.version_converter.convert_version(model, want)
    except Exception as e:
        raise RaiseError(f"onnx.version_converter cannot take {parent.id} from opset {have} "
                         f"to {want}: {type(e).__name__}: {str(e).strip()[:300]}",
                         f"artifact {parent.id} is intact; raise without opset= (the rules "
                         "that need a newer op fall back to functions)") from e


def _save(model: Any, path: Path, external: bool = False) -> None:
    """``model`` written once: its weights in ``model.onnx.data`` when ``external`` or past
    LARGE bytes; remembered as read and summarized (it was built here, not parsed)."""
    if external or summarize_onnx(model).initializer_bytes > LARGE:
        save_with_external_data(_copy(model), path, path.parent)
    else:  # no temp file, no fsync: the staging folder is the unit of atomicity
        path.write_bytes(model.SerializeToString())
    mark_readable(path)
    remember_summary(path, model)


def _copy(model: Any) -> Any:
    """A copy to write as external data (that moves the bytes out of the copy): the next
    try reads the model in memory again."""
    out = type(model)()
    out.CopyFrom(model)
    return out
