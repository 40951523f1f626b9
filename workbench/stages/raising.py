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
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..artifact import Artifact, Diagnostic, Workspace, as_workspace
from ..errors import InputError, WorkbenchError
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from .simplify import as_onnx_artifact

if TYPE_CHECKING:
    from ..rules import Rule

MAIN = "model.onnx"
REPORT = "raise_report.json"
TARGETS = ("standard", "functions")


class RaiseError(WorkbenchError):
    """Raising failed (an opset upgrade the converter refuses, a rule that crashes)."""


@dataclass
class Firing:
    """One place a rule fired: the nodes it replaced and the op that stands there now."""

    rule: str
    form: str  # "standard" or "function"
    nodes_before: list[str]
    ops_before: list[str]
    node_after: str
    op_after: str

    def __str__(self) -> str:
        return (f"{self.rule} [{self.form}]: {', '.join(self.nodes_before)} "
                f"({'+'.join(self.ops_before)}) -> {self.node_after} ({self.op_after})")


@dataclass
class RaiseReport:
    """What ``raise_ops`` did: firings, counts and op histograms before/after, drift vs parent."""

    target: str
    opset_before: int | None
    opset_after: int | None
    firings: list[Firing] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    max_abs_vs_parent: float | None = None
    max_rel_vs_parent: float | None = None  # element-wise (|diff| / (|ref| + 1e-6)), worst
    rel_vs_parent: float | None = None  # max abs diff / max |parent output|: the 1e-5 figure
    # rule -> the opset its standard op needs (None: the op exists but cannot express a match)
    fallbacks: dict[str, int | None] = field(default_factory=dict)
    disabled: list[str] = field(default_factory=list)  # rules dropped by the numeric check

    @property
    def counts(self) -> dict[str, int]:
        """How many times each rule fired."""
        return dict(Counter(f.rule for f in self.firings))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RaiseReport:
        d = dict(d)
        d["firings"] = [Firing(**f) for f in d.get("firings", [])]
        return cls(**d)

    @classmethod
    def of(cls, artifact: Artifact) -> RaiseReport:
        """The report of a raise artifact (read from its ``raise_report.json``)."""
        path = artifact.dir / REPORT if isinstance(artifact, Artifact) else None
        if path is None or artifact.stage != "raise" or not path.is_file():
            what = (f"artifact {artifact.id} from stage {artifact.stage!r}"
                    if isinstance(artifact, Artifact) else type(artifact).__name__)
            raise InputError(f"RaiseReport.of takes an artifact from wb.raise_ops, got {what}",
                             "pass the artifact raise_ops returned")
        return cls.from_dict(json.loads(path.read_text()))

    def summary(self) -> str:
        """One line: nodes before -> after, what fired, drift."""
        fired = ", ".join(f"{k} x{v}" for k, v in self.counts.items()) or "nothing fired"
        err = (f", max abs {self.max_abs_vs_parent:.3g} vs parent"
               if isinstance(self.max_abs_vs_parent, float) else "")
        return f"raise ({self.target}): {self.nodes_before} -> {self.nodes_after} nodes; {fired}{err}"

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            f"<tr><td>{html.escape(f.rule)}</td><td>{f.form}</td>"
            f"<td>{html.escape(', '.join(f.nodes_before))}</td>"
            f"<td>{html.escape('+'.join(f.ops_before))}</td>"
            f"<td>{html.escape(f.node_after)}</td><td>{html.escape(f.op_after)}</td></tr>"
            for f in self.firings)
        head = ("<tr><th>rule</th><th>form</th><th>nodes before</th><th>ops before</th>"
                "<th>node after</th><th>op after</th></tr>")
        notes = "".join(f"<br>{html.escape(line.strip())}" for line in str(self).splitlines()
                        if "function form" in line or "disabled" in line)
        return (f"<b>{html.escape(self.summary())}</b>{notes}"
                f"<table>{head}{rows}</table>")

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  {f}" for f in self.firings]
        for rule, op in self.fallbacks.items():
            why = f"the standard op needs opset {op}" if op else "no standard op for some"
            lines.append(f"  {rule}: function form ({why})")
        for rule in self.disabled:
            lines.append(f"  {rule}: disabled (the raised model did not match its parent)")
        return "\n".join(lines)


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
) -> Artifact:
    """Raise lowered subgraphs to high-level ops; returns a new ``raise`` Artifact.

    ``rules``: None (every registered rule), or rule names / ``Rule`` objects. ``target``:
    "standard" or "functions" (see the module docstring). ``opset``: upgrade the model's
    ai.onnx opset first (e.g. 21 for GroupNormalization). The report is
    ``RaiseReport.of(artifact)``; its figures are also in ``artifact.metrics``.
    """
    import onnx

    from ..checks import check_against, error_vs_torch, random_feeds, reference_data
    from ..graph import summarize
    from ..onnx_io import ensure_ort_readable, load_onnx
    from ..runtime.ort_runner import OrtRunner

    t0 = time.perf_counter()
    chosen = _resolve_rules(rules)
    if target not in TARGETS:
        raise InputError(f"raise_ops target={target!r} is not one of {TARGETS}",
                         "use 'standard' (standard ONNX ops where the opset has them) or "
                         "'functions' (local functions named after the PyTorch ops)")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int)
                              or opset < 1):
        raise InputError(f"raise_ops opset={opset!r} is not a positive int",
                         "e.g. opset=21 (GroupNormalization) or leave it None")
    parent = as_onnx_artifact(source, workspace, "raise_ops")
    ws = parent.workspace if workspace is None and parent.workspace else as_workspace(workspace)
    model = load_onnx(parent.path)
    opset_before = _default_opset(model)
    diags: list[Diagnostic] = []
    if opset is not None and opset_before is not None and opset != opset_before:
        model = _upgrade(model, opset_before, opset, parent)
        diags.append(Diagnostic("info", "opset-upgraded",
                                f"ai.onnx opset {opset_before} -> {opset} "
                                "(onnx.version_converter) before raising"))
    opset_now = _default_opset(model)

    before = parent.graph
    ref = reference_data(parent)
    example = dict(ref[0]) if ref else None
    feeds = random_feeds(parent.graph, example, seed)
    parent_runner = OrtRunner(parent.path)

    with ws.staging() as d:
        path = d / MAIN

        def attempt(rule_list: list[Rule]) -> tuple[Any, list[Firing], dict[str, int | None],
                                                     dict[str, Any], list[Diagnostic]]:
            raised, firings, fallbacks, errors = _apply(model, rule_list, target, opset_now)
            _save(raised, path)
            more = [Diagnostic("warning", "rule-crashed", f"rule {name!r}: {why}; its matches "
                               "were left as they were",
                               "fix the rule (or leave it out with rules=[...]); the other "
                               "rules ran") for name, why in errors.items()]
            lowered = ensure_ort_readable(path)
            if lowered:
                more.append(lowered)
            vs, check_diags = check_against(parent_runner, OrtRunner(path), feeds,
                                            "raise_ops", atol, rtol)
            return raised, firings, fallbacks, vs, more + check_diags

        raised, firings, fallbacks, vs_parent, more = attempt(chosen)
        disabled: list[str] = []
        if _broken(more) and firings and not _broken(attempt([])[4]):
            # Retry the rules that fired one at a time; keep each only if the model still
            # matches its parent. Bisecting would save runs, but a failure is rare and
            # this names the culprit exactly. (If even no rule at all breaks the model, the
            # opset upgrade did: no rule is blamed, the error diagnostic stays.)
            kept: list[Rule] = []
            fired = {f.rule for f in firings}
            for rule in chosen:
                if rule.name not in fired:
                    continue
                result = attempt([*kept, rule])
                if _broken(result[4]):
                    disabled.append(rule.name)
                    why = next(x.message for x in result[4] if x.level == "error")
                    diags.append(Diagnostic(
                        "warning", "rule-disabled",
                        f"rule {rule.name!r} was disabled: with it the raised model does not "
                        f"match its parent ({why})",
                        f"raise_ops(..., rules=[...]) without {rule.name!r}; please report "
                        "the model (the rule's check let through a subgraph it should not)"))
                else:
                    kept.append(rule)
            raised, firings, fallbacks, vs_parent, more = attempt(kept)
        diags.extend(more)
        for rule_name, needed in fallbacks.items():
            rule = next(r for r in chosen if r.name == rule_name)
            if needed is not None:
                diags.append(Diagnostic(
                    "info", "standard-op-needs-opset",
                    f"{rule_name}: the standard op {rule.standard_op} needs ai.onnx opset "
                    f"{needed}, the model has {opset_now}; raised to the function form "
                    f"pkg.workbench::{rule_name} instead",
                    f"wb.raise_ops(art, opset={needed}) upgrades the model first"))
            else:
                diags.append(Diagnostic(
                    "info", "standard-op-cannot-express",
                    f"{rule_name}: some matches cannot be written as {rule.standard_op} (e.g. "
                    "normalized axes it does not take, or unknown dims); they are raised to "
                    f"the function form pkg.workbench::{rule_name}",
                    "nothing to do; the function runs in ONNX Runtime as before"))
        try:
            onnx.checker.check_model(str(path))
        except onnx.checker.ValidationError as e:
            diags.append(Diagnostic("error", "onnx-checker",
                                    f"onnx.checker rejects the raised model: "
                                    f"{str(e).strip().splitlines()[0]}",
                                    "please report the model; raise with fewer rules"))
        after = summarize(path)
        rel = _relative(vs_parent["max_abs"], parent_runner, feeds)
        report = RaiseReport(
            target=target, opset_before=opset_before, opset_after=opset_now, firings=firings,
            nodes_before=before.node_count, nodes_after=after.node_count,
            ops_before=before.op_histogram, ops_after=after.op_histogram,
            max_abs_vs_parent=vs_parent["max_abs"], max_rel_vs_parent=vs_parent["max_rel"],
            rel_vs_parent=rel, fallbacks=fallbacks, disabled=disabled)
        (d / REPORT).write_text(json.dumps(report.to_dict(), indent=1))
        metrics = {
            "max_abs": error_vs_torch(path, ref),
            "max_abs_vs_parent": vs_parent["max_abs"], "max_rel_vs_parent": vs_parent["max_rel"],
            "rel_vs_parent": rel, "feeds_checked": vs_parent["feeds"],
            "nodes_before": before.node_count, "nodes_after": after.node_count,
            "ops_before": before.op_histogram, "ops_after": after.op_histogram,
            "fired": report.counts, "fallbacks": fallbacks, "disabled": disabled,
        }
        params = {"rules": [r.name for r in chosen], "target": target, "opset": opset,
                  "atol": atol, "rtol": rtol, "seed": seed}
        return ws.commit(d, stage="raise", format="onnx", main=MAIN, parent=parent,
                         params=params, seconds=time.perf_counter() - t0, diagnostics=diags,
                         metrics=metrics)


def _relative(max_abs: float | None, parent_runner: Any, feeds: list[Any]) -> float | None:
    """``max_abs`` over the largest magnitude of the parent's outputs on the first feed."""
    import numpy as np

    if max_abs is None or not feeds:
        return None
    try:
        outs = parent_runner.run(feeds[0]).values()
    except Exception:  # the check already said the parent does not run
        return None
    scale = max((float(np.abs(np.asarray(o, dtype=np.float64)).max()) for o in outs
                 if np.size(o)), default=0.0)
    return max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else None)


def _broken(diags: list[Diagnostic]) -> bool:
    return any(d.level == "error" for d in diags)


def _resolve_rules(rules: Any) -> list[Rule]:
    from .. import rules as registry

    if rules is None:
        return registry.all_rules()
    if isinstance(rules, (str, registry.Rule)):
        rules = [rules]
    try:
        items = list(rules)
    except TypeError:
        raise InputError(f"raise_ops rules= takes rule names or Rule objects, got "
                         f"{type(rules).__name__}", f"e.g. rules=['GELU', 'GroupNorm']; "
                         f"known: {registry.names()}") from None
    out: list[Rule] = []
    for item in items:
        if isinstance(item, registry.Rule):
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


def _save(model: Any, path: Path) -> None:
    import onnx

    large = model.ByteSize() > 1_800_000_000
    onnx.save_model(model, str(path), save_as_external_data=large,
                    all_tensors_to_one_file=True, location=f"{MAIN}.data")


def _canonicalize(graph: Any) -> int:
    """Move the constant operand of every Add/Mul second (patterns write constants second).

    Add and Mul commute exactly in IEEE arithmetic and broadcast symmetrically, so this
    changes no number; it spares each rule the 2^n operand-order variants of its pattern.
    """
    swapped = 0
    for node in graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Add", "Mul"):
            continue
        if len(node.inputs) != 2 or any(v is None for v in node.inputs):
            continue
        a, b = node.inputs
        if _is_const(a) and not _is_const(b):
            node.replace_input_with(0, b)
            node.replace_input_with(1, a)
            swapped += 1
    return swapped


def _is_const(value: Any) -> bool:
    return value.const_value is not None and not value.is_graph_input()


def _apply(model_proto: Any, chosen: list[Rule], target: str,
           opset: int | None) -> tuple[Any, list[Firing], dict[str, int | None], dict[str, str]]:
    """Apply ``chosen`` to a copy of ``model_proto``; the raised ModelProto and the firings."""
    import onnx_ir as ir
    import onnxscript.optimizer
    from onnxscript.rewriter import RewriteRule, RewriteRuleSet

    model = ir.serde.deserialize_model(model_proto)
    onnxscript.optimizer.basic_constant_propagation(model.graph)
    _canonicalize(model.graph)
    firings: list[Firing] = []
    fallbacks: dict[str, int | None] = {}
    stash: dict[tuple[str, str, str], Any] = {}
    errors: dict[str, str] = {}
    for rule in chosen:
        standard = target == "standard" and rule.standard is not None
        if standard and (opset is None or opset < (rule.opset or 0)):
            standard = False
            needs: int | None = rule.opset  # the opset lacks the op
        else:
            needs = None  # the op exists; a match its builder cannot express -> function
        forms = ["standard", "function"] if standard else ["function"]
        variants = [v for p in rule.patterns for v in _variants(_to_graph_pattern(p),
                                                                rule.commute)]
        for graph_pattern in variants:
            root = _root_op(graph_pattern)
            for form in forms:
                if root is not None and root not in _ops_present(model):
                    break  # cheap skip: no node could be the pattern's output
                hooks = _Hooks(rule, form, firings, errors)
                rr = RewriteRule(graph_pattern, hooks.replace, hooks.check, name=rule.name,
                                 as_function=form == "function")
                fired_before = len(firings)
                try:
                    RewriteRuleSet([rr]).apply_to_model(model)
                except Exception as e:
                    raise RaiseError(f"rule {rule.name!r} failed while rewriting: "
                                     f"{type(e).__name__}: {str(e).strip()[:300]}",
                                     f"raise without it: rules=[...] minus {rule.name!r}; "
                                     "please report the model") from e
                _stash_functions(model, stash)
                if (form == "function" and target == "standard" and rule.standard is not None
                        and len(firings) > fired_before):
                    fallbacks[rule.name] = needs
    for key, fn in stash.items():
        model.functions[key] = fn
    if firings:
        onnxscript.optimizer.remove_unused_nodes(model)  # Constant nodes the rules left unused
    _name_firings(model, firings)
    return ir.serde.serialize_model(model), firings, fallbacks, errors


def _to_graph_pattern(pattern: Any) -> Any:
    """The onnxscript GraphPattern of a pattern function (built once for both forms)."""
    from onnxscript.rewriter import _pattern_ir

    return _pattern_ir._to_graph_pattern(pattern)


def _variants(graph_pattern: Any, commute: bool) -> list[Any]:
    """The pattern, and with ``commute`` every operand order of its non-constant Add/Mul.

    onnxscript's own ``commute`` swaps every Add/Mul (2^n variants: 256 for tanh-GELU). The
    engine moves constant operands second first, so only nodes whose two operands are both
    computed (no ``c_*`` pattern variable, not the same value twice) need both orders.
    This reuses onnxscript's pattern cloning (GraphPattern/NodePattern.clone).
    """
    if not commute:
        return [graph_pattern]
    import itertools

    from onnxscript.rewriter import _pattern_ir as pir

    def swappable(node: Any) -> bool:
        if node.op_identifier() not in (("", "Add", ""), ("", "Mul", "")):
            return False
        a, b = node.inputs
        consts = [v for v in (a, b) if isinstance(v, pir.Var) and (v.name or "").startswith("c_")]
        return not consts and a is not b

    nodes = list(graph_pattern)
    space = [[False, True] if swappable(n) else [False] for n in nodes]
    out = []
    for swaps in itertools.product(*space):
        if not any(swaps):
            out.append(graph_pattern)
            continue
        node_map: dict[Any, Any] = {}
        inputs = [v.clone(node_map) for v in graph_pattern.inputs]
        new_nodes = [n.clone(node_map, s) for n, s in zip(nodes, swaps, strict=True)]
        outputs = [v.clone(node_map) for v in graph_pattern.outputs]
        out.append(pir.GraphPattern(inputs, outputs, new_nodes))
    return out


def _root_op(graph_pattern: Any) -> tuple[str, str] | None:
    """(domain, op type) of the pattern's output node, when it is a fixed op."""
    try:
        if not graph_pattern.has_single_output_node:
            return None
        ident = graph_pattern.output_node.op_identifier()
    except Exception:  # another onnxscript version: no skipping, just matching
        return None
    if ident is None:
        return None
    return (ident[0] if ident[0] not in ("ai.onnx",) else "", ident[1])


def _ops_present(model: Any) -> set[tuple[str, str]]:
    """(domain, op type) of every node in the graph and in the model's functions."""
    nodes = [*model.graph, *(n for f in model.functions.values() for n in f)]
    return {(n.domain if n.domain != "ai.onnx" else "", n.op_type) for n in nodes}


def _stash_functions(model: Any, stash: dict[tuple[str, str, str], Any]) -> None:
    """Move the functions rules just emitted out of the model until the end.

    onnxscript's rewriter also rewrites inside the model's functions, so a later pattern
    would otherwise match inside a function body an earlier one made (a GroupNorm body
    without its affine part raised again). Overloads are renumbered uniquely across the
    whole run (onnxscript numbers them from what is in ``model.functions``).
    """
    from ..rules import DOMAIN

    keys = [k for k in model.functions if k[0] == DOMAIN]  # stashed ones are not there
    # the calls of each function, found before any is renumbered; the stash numbers them
    # "w1", "w2"..., never a number onnxscript gives a new function ("1", "2"...), so a
    # call is never taken for another function's
    calls = {k: [n for n in model.graph if (n.domain, n.op_type, n.overload) == k]
             for k in keys}
    for key in keys:
        fn = model.functions.pop(key)
        overload = f"w{len(stash) + 1}"
        for node in calls[key]:
            node.overload = overload
        fn.overload = overload
        stash[fn.identifier()] = fn


class _Hooks:
    """The check and replacement handed to onnxscript for one rule; they record firings."""

    def __init__(self, rule: Rule, form: str, firings: list[Firing],
                 errors: dict[str, str]) -> None:
        self.rule, self.form, self.firings, self.errors = rule, form, firings, errors
        self._pending: list[Any] = []

    def _crashed(self, where: str, e: Exception) -> None:
        # a bug in one rule refuses its match and is reported; the other rules go on
        self.errors.setdefault(self.rule.name, f"{where} raised {type(e).__name__}: "
                                               f"{str(e).strip()[:200]}")

    def check(self, ctx: Any, **bindings: Any) -> Any:
        from ..rules import fail

        try:
            result = self.rule.check(ctx, **bindings)
        except Exception as e:
            self._crashed("its check", e)
            return fail(f"the check of {self.rule.name} crashed")
        if not result:
            return result
        if self.form == "function":
            inside = set(ctx.nodes)
            for k, v in bindings.items():
                if (k not in self.rule.inputs and hasattr(v, "const_value")
                        and v.const_value is None and v.producer() not in inside):
                    return fail(f"{k} is not a constant and not a function input of "
                                f"{self.rule.name}")
        order = {n: i for i, n in enumerate(ctx.graph_or_function)}
        self._pending = sorted(ctx.nodes, key=lambda n: order.get(n, 0))
        return result

    def replace(self, op: Any, **bindings: Any) -> Any:
        from ..rules import DOMAIN

        rule = self.rule
        if self.form == "function":
            args = [bindings[k] for k in rule.inputs if bindings.get(k) is not None]
            out = getattr(op, rule.name)(*args, _domain=DOMAIN)
        else:
            try:
                out = rule.standard(op, **bindings)  # type: ignore[misc]
            except Exception as e:
                self._crashed("its standard-op builder", e)
                return None
            if out is None:
                return None
        first = out[0] if isinstance(out, (list, tuple)) else out
        node = first.producer()
        tag = f"raise_{len(self.firings)}_{rule.name}"
        if node is not None:
            node.name = tag
        op_after = (f"{DOMAIN}::{rule.name}" if self.form == "function"
                    else node.op_type if node is not None else "?")
        self.firings.append(Firing(
            rule=rule.name, form=self.form,
            nodes_before=[n.name or f"<{n.op_type}>" for n in self._pending],
            ops_before=[n.op_type for n in self._pending], node_after=tag, op_after=op_after))
        return out


def _name_firings(model: Any, firings: list[Firing]) -> None:
    """Give each raised node a readable unique name (the op, numbered) and record it."""
    by_tag = {n.name: n for n in model.graph}
    used = {n.name for n in model.graph}
    seen: Counter[str] = Counter()
    for f in firings:
        node = by_tag.get(f.node_after)
        base = f.rule
        seen[base] += 1
        name = base if seen[base] == 1 else f"{base}_{seen[base] - 1}"
        while name in used:
            name += "_"
        used.add(name)
        if node is not None:
            node.name = name
        f.node_after = name
