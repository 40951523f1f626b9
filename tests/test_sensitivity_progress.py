"""The sensitivity ranking keeps the user informed and says what it ranked (issue 35, item 5;
item 4's last clause).

- One progress bar follows the whole ranking, for each backend: it is open and moving while
  the captures, the float parent's pairing, the isolated run and (ncnn) the int8 readers'
  input rounding run (that last step ran after the bar had closed: ~65 s of nothing on a
  trained MobileNetV2), and it ends full.
- ``rep.sensitivity()`` without a candidate ranks the low-precision candidate whose *output*
  is worst, and its result says which it ranked and why. It used to rank the one with the
  worst tensor anywhere: onnxruntime's QDQ model rounds the two near-equal terms of a
  difference to int8 and the difference itself sinks to 0 dB, while its output is 20 dB
  better than ncnn's (ncnn computes that difference in float).
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import workbench as wb
import workbench.comparison.sensitivity as sens


class Chain(nn.Module):
    """Three convs with ReLUs: each int8 conv reads the int8 conv before it (ncnn rounds
    that input inside the reader, the step measured after the layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 4, 3, padding=1)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.relu2(self.b(self.relu1(self.a(x)))))


class Diff(nn.Module):
    """a - (0.995 a + 0.002): a small difference of two near-equal terms."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a - (a * 0.995 + 0.002)


class NearDiff(nn.Module):
    """conv -> ReLU -> x + Diff(x) -> conv -> ReLU -> pool -> Linear. onnxruntime rounds
    ``0.995 a + 0.002`` to int8 before the subtraction (the difference's own SNR ~0 dB); ncnn
    subtracts in float. The difference is 1/200 of the sum: the output hardly feels it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        self.diff, self.pool = Diff(), nn.MaxPool2d(4)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.relu1(self.conv1(x))
        return self.fc(self.pool(self.relu2(self.conv2(a + self.diff(a)))).flatten(1))


def _samples(n: int = 6, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(1, 3, 16, 16, generator=g) for _ in range(n)]


class _Bars:
    """Every tqdm bar the ranking opens (``tqdm.auto.tqdm`` replaced), and what the bar was
    doing when a spied step of the ranking ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import tqdm.auto
        from tqdm import tqdm as plain

        self.bars: list[plain] = []
        self.seen: list[tuple[str, int | None, bool, str]] = []  # step, n, closed, postfix
        bars = self.bars

        class Spy(plain):
            def __init__(self, *args, **kwargs) -> None:
                kwargs["disable"] = False  # recorded whether shown or not
                kwargs["file"] = io.StringIO()
                super().__init__(*args, **kwargs)
                bars.append(self)

        monkeypatch.setattr(tqdm.auto, "tqdm", Spy)

    def spy(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        """Note the newest bar's state each time ``sensitivity.<name>`` runs."""
        real = getattr(sens, name)

        def spied(*args, **kwargs):
            bar = self.bars[-1] if self.bars else None
            self.seen.append((name, None if bar is None else bar.n,
                              bar is None or bool(getattr(bar, "disable", True)),
                              "" if bar is None else str(bar.postfix or "")))
            return real(*args, **kwargs)

        monkeypatch.setattr(sens, name, spied)


@pytest.fixture(scope="module")
def chain_ncnn(tmp_path_factory):
    torch.manual_seed(0)
    model, samples = Chain().eval(), _samples()
    ws = wb.Workspace(tmp_path_factory.mktemp("progress") / "ws")
    x = (samples[0],)
    q = wb.quantize(wb.to_ncnn(model, x, workspace=ws), samples, method="minmax",
                    progress=False)
    onx = wb.export(model, x, workspace=ws)
    q_ort = wb.quantize(onx, samples, progress=False)
    return model, x, q, q_ort


@pytest.mark.parametrize("backend", ["ncnn", "onnxruntime"])
def test_one_bar_follows_the_whole_ranking_and_ends_full(chain_ncnn, monkeypatch, backend):
    model, x, q_ncnn, q_ort = chain_ncnn
    rep = wb.compare(model, [q_ncnn if backend == "ncnn" else q_ort], x, mode="both",
                     progress=False)
    bars = _Bars(monkeypatch)
    steps = ["_parent_paired", "_isolated", "_entry"]
    steps += ["_rounding_cost"] if backend == "ncnn" else ["_parent_names"]
    for name in steps:
        bars.spy(monkeypatch, name)
    ranking = rep.sensitivity(progress=True)
    assert ranking, ranking.summary()
    assert len(bars.bars) == 1, "one bar for the whole ranking"
    bar = bars.bars[0]
    assert bar.n == bar.total and bar.total > len(ranking), (bar.n, bar.total)
    ran = {name for name, *_ in bars.seen}
    assert set(steps) <= ran, f"{set(steps) - ran} did not run: the test sees nothing"
    for name, n, closed, postfix in bars.seen:
        assert n is not None and not closed, f"{name} ran with no bar open"
        assert postfix, f"{name} ran with the bar saying nothing of what runs"
    # the bar moves in the step after the layers too (each int8 reader's input rounding)
    after = [n for name, n, *_ in bars.seen if name == steps[-1]]
    layers = max(n for name, n, *_ in bars.seen if name == "_entry")
    assert after[0] > layers, (after, layers)
    if backend == "ncnn":
        assert len(after) >= 2 and after == sorted(after) and after[-1] > after[0], after
    # and the time each step took is kept beside the ranking
    assert {"capture", "isolated run", "layers"} <= set(ranking.seconds), ranking.seconds


@pytest.fixture(scope="module")
def near_diff(tmp_path_factory):
    torch.manual_seed(0)
    model, samples = NearDiff().eval(), _samples()
    ws = wb.Workspace(tmp_path_factory.mktemp("choice") / "ws")
    x = (samples[0],)
    q_ort = wb.quantize(wb.export(model, x, workspace=ws), samples, progress=False)
    q_ncnn = wb.quantize(wb.to_ncnn(model, x, workspace=ws), samples, progress=False)
    rep = wb.compare(model, [q_ort, q_ncnn], x, mode="both", progress=False)
    return rep


def _worst(rep, name: str, outputs_only: bool) -> float:
    cand = next(c for c in rep.candidates if c.name == name)
    outs = set(cand.runner.output_names)
    return min(r.metrics.snr_db for r in rep.records
               if r.candidate == name and r.mode == "accumulated"
               and (not outputs_only or r.name in outs))


def test_the_default_ranks_the_candidate_whose_output_is_worst_and_says_so(near_diff):
    rep = near_diff
    ort, ncnn = (c.name for c in rep.candidates)
    assert ort.startswith("onnxruntime int8") and ncnn.startswith("ncnn int8")
    # the case: onnxruntime holds the worst tensor, ncnn the worse output
    assert _worst(rep, ort, False) < _worst(rep, ncnn, False) - 5
    assert _worst(rep, ncnn, True) < _worst(rep, ort, True) - 5
    ranking = rep.sensitivity(progress=False)
    assert ranking.candidate == ncnn
    assert [r.candidate for r in rep.sensitive(2)] == [ncnn] * len(rep.sensitive(2))
    choice = ranking.choice
    assert choice.worst == ncnn and choice.by == "output" and set(choice.outputs) == {ort, ncnn}
    line = ranking.summary().splitlines()[0]
    print("\n" + line)
    assert line.startswith(f"ranked: {ncnn}, the worst output of the 2 low-precision")
    assert f"{ort} {_worst(rep, ort, True):.1f} dB" in line
    assert f"Ranking of {ncnn}" in repr(ranking) and "the worst output" in repr(ranking)


def test_a_candidate_named_is_ranked_and_the_result_says_it_is_not_the_worst(near_diff):
    rep = near_diff
    ort, ncnn = (c.name for c in rep.candidates)
    ranking = rep.sensitivity(ort, progress=False)
    assert ranking.candidate == ort and ranking.choice.worst == ncnn
    assert f"as asked, not the worst output (rep.sensitivity() ranks {ncnn})" in \
        ranking.summary()
