"""compare's capture phase (comparison/capture.py): the reference's ReferenceIndex is built
once per input set that still has a candidate to align, and shared by its candidates, which
is safe because aligning only reads it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.comparison import capture
from workbench.comparison.align import ReferenceIndex, align
from workbench.comparison.candidates import as_candidate, candidate_tensors, with_weights


@pytest.fixture(scope="module")
def two_candidates(tmp_path_factory):
    torch.manual_seed(0)
    model, x = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("capture") / "ws")
    onx = wb.export(model, x, workspace=ws)
    return model, x, [onx, wb.simplify(onx, backend="onnxslim")]


def _state(ix: ReferenceIndex) -> dict:
    """Everything of the index but the arrays and the samples cache (which grows as records
    are scored, and is shared on purpose)."""
    return {k: copy.deepcopy(v) for k, v in vars(ix).items() if k not in ("arrays", "samples")}


def test_aligning_leaves_the_shared_index_as_it_was(two_candidates):
    from workbench.runtime import TorchRunner

    model, x, arts = two_candidates
    modules = {n for n, _ in model.named_modules()}
    ref = TorchRunner(model).run(x, capture="all")
    ix = ReferenceIndex(ref, modules, {})
    before = _state(ix)
    for art in arts:
        cand = as_candidate(art, 0)
        values = cand.runner.run(x, "all")
        tensors = with_weights(candidate_tensors(cand, modules), cand, model)
        shared = align(ix, values, tensors, modules)
        own = align(ref, values, tensors, modules)  # an index of its own, as before
        assert shared.pairs == own.pairs and shared.relations == own.relations
        assert shared.unaligned == own.unaligned and shared.attributed == own.attributed
        assert _state(ix) == before
        assert all(np.array_equal(ix.arrays[n], ref[n]) for n in ref)


def test_compare_builds_one_index_per_input_set_that_aligns(two_candidates, monkeypatch):
    model, x, arts = two_candidates
    built = []

    class Counted(ReferenceIndex):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(capture, "ReferenceIndex", Counted)
    sets = [x, tuple(t + 0.5 for t in x)]  # two input sets: the second aligns nothing
    rep = wb.compare(model, arts, sets, progress=False)
    assert len(built) == 1
    assert len(rep.alignments) == 2 and all(al.pairs for al in rep.alignments.values())
    assert rep.ok, rep.summary()
