"""Task metrics beside tensors: each metric on hand-made arrays, then wb.compare,
wb.precision_table and the compare panel scoring real ONNX Runtime / ncnn candidates, and
every bad input a hinted InputError naming it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.comparison.task import CENTS_OFFSET, crepe_cents, evaluate
from workbench.runtime import OrtRunner, TorchRunner

N_SAMPLES = 16


# -- the metrics on hand-made arrays ------------------------------------------------------
def _logits(classes: list[int], width: int = 5) -> list[np.ndarray]:
    """One (1, width) sample per class, that class the largest."""
    rng = np.random.default_rng(0)
    out = []
    for c in classes:
        row = rng.uniform(0, 1, (1, width))
        row[0, c] = 2.0
        out.append(row.astype(np.float32))
    return out


def test_topk_counts_the_samples_whose_top_class_agrees():
    ref = _logits([0, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    cand = [a.copy() for a in ref]
    for i, new in ((2, 0), (5, 3), (9, 1)):  # three samples answer another class
        cand[i][0, new] = 3.0
    got = wb.TopK(1).score(ref, cand)
    assert (got.agree, got.total, got.disagreeing) == (7, 10, (2, 5, 9))
    assert got.value == pytest.approx(0.7) and got.fraction == pytest.approx(0.7)
    assert got.text == "top-1 agrees on 7/10" and str(got) == got.text
    assert got.cell == "7/10" and got.all_agree is False
    assert json.loads(json.dumps(got.as_dict()))["disagreeing"] == [2, 5, 9]


def test_topk_k_finds_the_reference_top_class_among_the_candidates_best_k():
    ref = [np.array([[0.1, 0.9, 0.5, 0.0]]), np.array([[0.9, 0.1, 0.5, 0.0]])]
    cand = [np.array([[0.1, 0.6, 0.7, 0.0]]),  # reference's top (1) is 2nd here
            np.array([[0.1, 0.2, 0.5, 0.6]])]  # reference's top (0) is last here
    assert wb.TopK(1).score(ref, cand).agree == 0
    top2 = wb.TopK(2).score(ref, cand)
    assert (top2.agree, top2.disagreeing, top2.text) == (1, (1,), "top-2 agrees on 1/2")
    assert wb.TopK(3).score(ref, cand).agree == 1


def test_a_batched_sample_counts_each_row():
    ref = [np.eye(4, dtype=np.float32)]  # one sample of 4 rows: classes 0..3
    cand = [np.eye(4, dtype=np.float32)[[0, 1, 3, 3]]]
    got = wb.TopK(1).score(ref, cand)
    assert (got.agree, got.total, got.disagreeing) == (3, 4, (2,))


def test_nearest_neighbour_agreement_drops_when_embeddings_are_permuted():
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(8, 16)).astype(np.float32)
    ref = [e[None] for e in emb]
    same = wb.NearestNeighbour().score(ref, [e[None] * 3.0 for e in emb])  # scale: same cosine
    assert (same.agree, same.total) == (8, 8) and same.value == pytest.approx(1.0, abs=1e-6)
    assert same.unit == "cosine" and same.text == "nearest neighbour agrees on 8/8, cosine 1.0000"
    swapped = emb[[1, 0, 2, 3, 5, 4, 6, 7]]  # two pairs swap their embeddings
    got = wb.NearestNeighbour().score(ref, [e[None] for e in swapped])
    assert (got.agree, got.disagreeing) == (4, (0, 1, 4, 5))
    assert got.value < 0.9  # the swapped pairs' cosines are those of unrelated vectors
    # a little noise moves the cosine, not the neighbours
    noisy = wb.NearestNeighbour().score(ref, [e[None] + 0.01 * rng.normal(size=(1, 16))
                                              for e in emb])
    assert noisy.agree == 8 and 0.99 < noisy.value < 1.0


def _crepe(centres: list[float], sigma: float = 1.25) -> np.ndarray:
    """CREPE-like activations: a Gaussian over the 360 bins around each (fractional) bin."""
    bins = np.arange(360)
    return np.stack([np.exp(-((bins - c) ** 2) / (2 * sigma ** 2)) for c in centres])


def test_crepe_cents_is_the_weighted_average_around_the_peak():
    # bins 100 and 101 alone, equally: halfway, 20 cents a bin above 1997.38 cents
    a = np.zeros((1, 360))
    a[0, 100] = a[0, 101] = 0.8
    a[0, 200] = 0.3  # outside the 9 bins around the peak: no weight
    assert crepe_cents(a)[0] == pytest.approx(20 * 100.5 + CENTS_OFFSET)
    # a Gaussian: its centre, up to the 9-bin window's truncation of its tails (0.02 cents)
    got = crepe_cents(_crepe([37.3, 250.0]))
    assert got == pytest.approx([20 * 37.3 + CENTS_OFFSET, 20 * 250 + CENTS_OFFSET], abs=0.05)
    # a peak at the first bin: the window is clipped, not wrapped
    edge = np.zeros((1, 360))
    edge[0, 0], edge[0, 359] = 1.0, 0.9
    assert crepe_cents(edge)[0] == pytest.approx(CENTS_OFFSET)
    # bin 0 is 31.7 Hz (10 Hz * 2 ** (cents / 1200))
    assert 10 * 2 ** (crepe_cents(edge)[0] / 1200) == pytest.approx(31.70, abs=0.01)


def test_pitch_cents_reads_a_known_error_from_synthetic_activations():
    centres = [60.0, 120.0, 180.0, 240.0, 300.0]
    shifts = [0.1, 0.2, 0.2, 0.3, 4.0]  # bins: 2, 4, 4, 6 and 80 cents
    ref = [_crepe([c]).astype(np.float32) for c in centres]
    cand = [_crepe([c + s]).astype(np.float32) for c, s in zip(centres, shifts, strict=True)]
    got = wb.PitchCents().score(ref, cand)
    assert got.unit == "cents" and got.value == pytest.approx(4.0, abs=0.05)
    assert (got.agree, got.total, got.disagreeing) == (4, 5, (4,))
    assert got.text == "median pitch error 4.0 cents, 4/5 within 50"
    assert wb.PitchCents(within=3).score(ref, cand).agree == 1


def test_pitch_cents_decodes_another_output_to_hertz():
    ref = [np.array([[440.0]]), np.array([[220.0]])]
    cand = [np.array([[440.0 * 2 ** (10 / 1200)]]), np.array([[220.0 * 2 ** (-30 / 1200)]])]
    got = wb.PitchCents(decode=lambda rows: rows[:, 0], within=20).score(ref, cand)
    assert got.value == pytest.approx(20.0) and got.agree == 1


def test_decision_counts_the_samples_on_the_same_side_of_the_threshold():
    ref = [np.array([[v]]) for v in (0.2, 0.7, 0.9, 0.4, 0.51)]
    cand = [np.array([v]) for v in (0.6, 0.8, 0.4, 0.1, 0.49)]  # batch axis dropped: fine
    got = wb.Decision().score(ref, cand)
    assert (got.agree, got.total, got.disagreeing) == (2, 5, (0, 2, 4))
    assert got.text == "decision agrees on 2/5"
    assert wb.Decision(threshold=0.45).score(ref, cand).agree == 3


def test_custom_gets_the_outputs_stacked_and_returns_a_number_or_a_score():
    ref = [np.full((1, 3), float(i)) for i in range(4)]
    cand = [a + 0.5 for a in ref]
    seen = {}

    def mean_shift(r, c):
        seen["shape"] = r.shape
        return np.float32(np.mean(c - r))

    got = wb.Custom(mean_shift).score(ref, cand)
    assert seen["shape"] == (4, 1, 3)
    assert (got.task, got.value, got.agree, got.total) == ("mean_shift", 0.5, None, 4)
    assert got.text == "mean_shift 0.5" and got.fraction is None and got.cell == "0.5"
    mine = wb.TaskScore("mine", 1.0, "", 3, 4, "mine: 3 of 4")
    assert wb.Custom(lambda r, c: mine, "mine").score(ref, cand) is mine


# -- bad input, on arrays -----------------------------------------------------------------
@pytest.mark.parametrize("k", [0, -1, 1.5, True, "1"])
def test_k_must_be_a_positive_int(k):
    with pytest.raises(wb.InputError, match=r"TopK\(k=") as e:
        wb.TopK(k)
    assert e.value.hint


@pytest.mark.parametrize("task, shape, says", [
    (wb.TopK(1), (1, 1), "more than k=1"),
    (wb.TopK(5), (1, 5), "more than k=5"),
    (wb.PitchCents(), (1, 10), "360 pitch bins"),
    (wb.NearestNeighbour(), (1, 1), "embeddings along the last axis"),
    (wb.Decision(), (1, 2), "one value a sample"),
])
def test_an_output_that_does_not_fit_the_metric_is_named(task, shape, says):
    arrays = [np.zeros(shape, np.float32), np.ones(shape, np.float32)]
    with pytest.raises(wb.InputError, match=says) as e:
        task.score(arrays, arrays)
    assert f"sample 0's output is {list(shape)}" in e.value.message
    assert task.name in e.value.message and e.value.hint


def test_nearest_neighbour_needs_two_embeddings():
    with pytest.raises(wb.InputError, match="at least 2"):
        wb.NearestNeighbour().score([np.ones((1, 4))], [np.ones((1, 4))])


def test_outputs_of_different_sizes_or_counts_are_refused():
    with pytest.raises(wb.InputError, match=r"reference's output is \[1, 5\], the candidate's"):
        wb.TopK(1).score([np.zeros((1, 5))], [np.zeros((1, 6))])
    with pytest.raises(wb.InputError, match="1 reference output"):
        wb.TopK(1).score([np.zeros((1, 5))], [np.zeros((1, 5))] * 2)


def test_a_custom_fn_that_raises_or_returns_no_number_is_named():
    arrays = [np.zeros((1, 3))] * 2

    def broken(r, c):
        raise ZeroDivisionError("no samples")

    with pytest.raises(wb.InputError, match=r"task 'broken': fn raised ZeroDivisionError: "
                                            "no samples") as e:
        wb.Custom(broken).score(arrays, arrays)
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    for bad, kind in (("0.9", "str"), ({"acc": 1.0}, "dict"), (True, "bool"),
                      (np.zeros(3), "ndarray")):
        with pytest.raises(wb.InputError, match=f"task 'acc': fn returned a {kind}"):
            wb.Custom(lambda r, c, bad=bad: bad, "acc").score(arrays, arrays)
    with pytest.raises(wb.InputError, match="not callable"):
        wb.Custom("accuracy")


def test_bad_task_settings_are_named():
    with pytest.raises(wb.InputError, match=r"PitchCents\(within=0\)"):
        wb.PitchCents(within=0)
    with pytest.raises(wb.InputError, match=r"Decision\(threshold=nan\)"):
        wb.Decision(math.nan)
    with pytest.raises(wb.InputError, match=r"output=1.5"):
        wb.TopK(1, output=1.5)
    with pytest.raises(wb.InputError, match="data=.*an empty list"):
        wb.TopK(1, data=[])
    with pytest.raises(wb.InputError, match="data=.*a Tensor") as e:
        wb.TopK(1, data=torch.zeros(4, 3))
    assert "split(1)" in e.value.hint


# -- real models, real backends -----------------------------------------------------------
class _Classifier(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    model, other = _Classifier(0).eval(), _Classifier(1).eval()
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(1, 3, 16, 16, generator=g),)
    data = [(torch.rand(1, 3, 16, 16, generator=g),) for _ in range(N_SAMPLES)]
    ws = wb.Workspace(tmp_path_factory.mktemp("task") / "ws")
    onx = wb.export(model, x, workspace=ws, output_names=["logits"])
    damaged = wb.export(other, x, workspace=ws, output_names=["logits"])
    with torch.no_grad():  # the oracle: how often the other model answers as the model does
        agree = sum(int(model(s).argmax() == other(s).argmax()) for (s,) in data)
    assert agree < N_SAMPLES - 2  # the damaged candidate differs, or the test shows nothing
    return model, x, data, ws, onx, damaged, agree


def test_compare_scores_each_candidates_answers(parts):
    model, x, data, _, onx, damaged, agree = parts
    rep = wb.compare(model, [onx, damaged], x, task=wb.TopK(1, data=data), progress=False)
    good, bad = (c.name for c in rep.candidates)
    assert (rep.task[good].agree, rep.task[good].total) == (N_SAMPLES, N_SAMPLES)
    assert rep.task[bad].agree == agree and rep.task[bad].total == N_SAMPLES
    lines = rep.summary().splitlines()
    assert lines[-2:] == [f"{good}: top-1 agrees on {N_SAMPLES}/{N_SAMPLES}",
                          f"{bad}: top-1 agrees on {agree}/{N_SAMPLES}"]
    assert rep.task_lines() == lines[-2:]
    assert json.loads(rep.to_json())["task"][bad]["agree"] == agree
    html = rep._repr_html_()
    assert 'class="wb-task"' in html and f"<td>{agree}/{N_SAMPLES}</td>" in html


def test_compare_without_data_scores_its_inputs_and_picks_an_output_by_name(parts):
    model, x, data, _, onx, damaged, _ = parts
    sets = [d for d in data[:3]]
    rep = wb.compare(model, [damaged], sets, task=wb.NearestNeighbour(output="logits"),
                     progress=False)
    (score,) = rep.task.values()
    assert score.total == 3 and score.value < 0.999  # another model's logits
    rep = wb.compare(model, [onx], sets, task=wb.NearestNeighbour(output="logits"),
                     progress=False)
    (score,) = rep.task.values()
    assert (score.agree, score.total) == (3, 3) and score.value == pytest.approx(1, abs=1e-5)
    plain = wb.compare(model, [onx], x, progress=False)
    assert plain.task == {} and plain.task_lines() == [] and "wb-task" not in \
        plain._repr_html_() and json.loads(plain.to_json())["task"] == {}


def test_evaluate_names_an_output_that_does_not_exist_or_does_not_fit(parts):
    model, x, data, _, onx, _, _ = parts
    ref, cand = TorchRunner(model), OrtRunner(onx)
    assert evaluate(wb.TopK(1, output=-1), ref, cand, data[:2]).agree == 2
    with pytest.raises(wb.InputError, match=r"output=1 does not exist: the candidate has 1 "
                                            r"output\(s\) \['logits'\]"):
        evaluate(wb.TopK(1, output=1), ref, cand, x)
    with pytest.raises(wb.InputError, match=r"output='probs' is not an output of the model: "
                                            r"the candidate's are \['logits'\]") as e:
        evaluate(wb.Decision(output="probs"), ref, cand, x)
    assert "output=0" in e.value.hint
    with pytest.raises(wb.InputError, match=r"360 pitch bins") as e:
        evaluate(wb.PitchCents(), ref, cand, x)
    assert "[1, 10]" in e.value.message
    with pytest.raises(wb.InputError, match="one value a sample"):
        evaluate(wb.Decision(), ref, cand, x)
    with pytest.raises(wb.InputError, match="at least 2"):
        evaluate(wb.NearestNeighbour(), ref, cand, x)


def test_an_evaluation_set_of_the_wrong_arity_rank_or_shape_is_named(parts):
    model, x, data, _, onx, _, _ = parts
    ref, cand = TorchRunner(model), OrtRunner(onx)
    with pytest.raises(wb.InputError, match=r"data\[1\] holds 2 tensor\(s\), the model "
                                            "takes 1") as e:
        wb.compare(model, [onx], x, task=wb.TopK(1, data=[data[0], (x[0], x[0])]),
                   progress=False)
    assert "float32[1x3x16x16]" in e.value.hint
    with pytest.raises(wb.InputError, match=r"data\[0\]\[0\] is float32\[3x16x16\] \(rank 3\); "
                                            r"the model's input 0 is float32\[1x3x16x16\]"):
        evaluate(wb.TopK(1, data=[x[0][0]]), ref, cand, x)
    with pytest.raises(wb.InputError, match=r"data\[0\]\[0\] is a str, expected a torch.Tensor"):
        evaluate(wb.TopK(1, data=[("image.png",)]), ref, cand, x)
    # the torch model pools any size; the exported graph takes 16x16 only
    with pytest.raises(wb.InputError, match=r"task 'top-1': data\[0\] does not fit the "
                                            "candidate"):
        evaluate(wb.TopK(1, data=[torch.rand(1, 3, 8, 8)]), ref, cand, x)


def test_a_task_that_is_not_a_task_is_refused_before_anything_runs(parts):
    model, x, _, _, onx, _, _ = parts
    with pytest.raises(wb.InputError, match="task= is a str, not a task metric") as e:
        wb.compare(model, [onx], x, task="top1", progress=False)
    assert "wb.TopK(1)" in e.value.hint
    with pytest.raises(wb.InputError, match="task=TopK is the class"):
        wb.compare(model, [onx], x, task=wb.TopK, progress=False)
    with pytest.raises(wb.InputError, match="task= is a function"):
        wb.precision_table(model, [onx], x, task=lambda r, c: 1.0, progress=False)


def test_precision_table_scores_every_row_with_its_checked_runner(parts):
    model, x, data, ws, onx, damaged, agree = parts
    nc = wb.to_ncnn(model, x, workspace=ws)
    # the ONNX output's name picks ncnn's out0 too
    table = wb.precision_table(model, {"ort": onx, "other": damaged, "ncnn": nc}, x,
                               repeat=2, warmup=0, progress=False,
                               task=wb.TopK(1, data=data, output="logits"))
    got = {r.label: (r.task.agree, r.task.total) for r in table.rows}
    assert got == {"ort": (N_SAMPLES, N_SAMPLES), "other": (agree, N_SAMPLES),
                   "ncnn": (N_SAMPLES, N_SAMPLES)}  # ncnn's outputs drop the batch axis
    head, *rows = table.table()
    assert head[-1] == "top-1" and [r[-1] for r in rows] == [
        f"{N_SAMPLES}/{N_SAMPLES}", f"{agree}/{N_SAMPLES}", f"{N_SAMPLES}/{N_SAMPLES}"]
    lines = table.summary().splitlines()
    other = next(ln for ln in lines if ln.startswith("other: "))
    assert other.endswith(f"vs ort, top-1 agrees on {agree}/{N_SAMPLES}")
    assert f"<td>{agree}/{N_SAMPLES}</td>" in table._repr_html_()
    plain = wb.precision_table(model, [onx], x, repeat=1, warmup=0, progress=False)
    assert plain.rows[0].task is None and plain.table()[0][-1] == "max abs"


def test_the_compare_panel_shows_the_task_and_its_code_runs(parts):
    pytest.importorskip("ipywidgets")
    from workbench.ui.panels import ComparePanel

    model, x, data, ws, onx, damaged, agree = parts
    task = wb.TopK(1, data=data)
    panel = ComparePanel(model, x, [onx, damaged], workspace=ws, mode="accumulated", task=task)
    assert f"task: top-1 over {N_SAMPLES} sample(s)" in panel.candidates_html.value
    rep = panel.run()
    assert panel.error is None, panel.result_html.value
    assert f"<div class='wb-task'>{rep.task_lines()[1]}</div>" in panel.result_html.value
    assert rep.task_lines()[1].endswith(f"top-1 agrees on {agree}/{N_SAMPLES}")
    code = panel.code()
    assert "task=wb.TopK(k=1, data=task_data)" in code and "# task_data: the evaluation set" \
        in code
    ns = {"model": model, "inputs": x, "task_data": data}
    exec(compile(code, "<panel code>", "exec"), ns)
    assert [s.agree for s in ns["rep"].task.values()] == [N_SAMPLES, agree]
    # wb.ui.Pipeline hands compare's settings to the panel
    pipe = wb.ui.Pipeline(model, x, workspace=ws, compare={"task": task})
    assert pipe.panels["compare"].task is task
    with pytest.raises(wb.InputError, match="task= is a int"):
        ComparePanel(model, x, [onx], workspace=ws, task=1)
