"""The alignment rule engine: each heuristic an AlignRule in a module named for it, stating
the graph pattern it handles, with a test of its own; the ReferenceIndex built once."""

import ast
from pathlib import Path

import numpy as np
import pytest

from workbench.comparison import align as align_pkg
from workbench.comparison.align import RULES, AlignRule, ReferenceIndex, without

PACKAGE = Path(align_pkg.__file__).parent
TESTS = Path(__file__).parent


def test_every_rule_lives_in_a_module_named_for_it_with_a_test_of_its_own():
    names = [r.name for r in RULES]
    assert len(set(names)) == len(names)
    for rule in RULES:
        assert rule.apply.__module__ == f"workbench.comparison.align.{rule.name}", rule
        assert (TESTS / f"test_align_{rule.name}.py").exists(), rule.name


def test_a_rule_states_its_pattern_and_its_stage():
    with pytest.raises(TypeError, match="pattern"):
        AlignRule("nameless", " ", lambda walk, v: None)
    with pytest.raises(TypeError, match="stage"):
        AlignRule("x", "a pattern", lambda walk, v: None, stage="later")


def test_without_names_only_known_rules():
    assert len(without("value_match")) == len(RULES) - 1
    with pytest.raises(KeyError, match="no alignment rule named"):
        without("no_such_rule")


def test_no_function_in_the_package_is_over_80_lines():
    long = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long.append(f"{path.name}:{node.name} ({n} lines)")
    assert not long


def test_the_reference_index_knows_calls_scopes_and_output_aliases():
    x = np.ones((1, 4), np.float32)
    reference = {"relu": x, "block/Tensor.add_0": x + 1, "relu#1": x + 2, "lstm.0": x + 3,
                 "lstm.1": x + 4, "F.interpolate_0": x + 5, "output_0": x + 4}
    ix = ReferenceIndex(reference, {"relu", "block", "lstm"})
    assert ix.calls == {"relu": [0, 2]}
    assert ix.module_of == ["relu", "block", "relu", "lstm", "lstm", "", ""]
    assert ix.scopes["lstm"] == [3, 4] and ix.scopes["block"] == [1]
    assert ix.alias == {"output_0": "lstm.1"}  # the record the output repeats
    assert ix.owner(2) == "relu" and ix.owner(1) == "block"
    samples = {}
    ReferenceIndex(reference, set(), samples).sample(0)
    assert list(samples) == ["relu"]  # the caller's dict keeps them for the next candidate
