"""Applying raising rules to a model with onnxscript's rewriter on onnx-ir: operand order
made canonical, each rule's pattern tried in its variants, the replaced nodes recorded as
firings (the raise report), local functions kept for the function form."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import RaiseError
from ..rules import DOMAIN, Rule, fail


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


def apply_rules(model_proto: Any, chosen: list[Rule], target: str,
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
