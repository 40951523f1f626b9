"""The ncnn and compare panels on an ARM target (ncnn's aarch64 build under QEMU user mode):
the target choice lists this machine and each ARM target by what it stands for; the ncnn panel
checks the converted model there, the compare panel runs its ncnn candidates there; "Show
code" writes ``target=`` and runs (exec'd on ``model`` and ``inputs`` alone); a missing ARM
environment is the hinted error in the panel, never an exception out of Run. One tiny model
whose fp16 accumulation overflows on ARMv8.2."""

from __future__ import annotations

import pytest
from arm_probe import Probe, probe_input

import workbench as wb
from workbench.errors import InputError
from workbench.runtime.arm_env import TARGETS
from workbench.ui.panels import ComparePanel, NcnnPanel


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    model, x = Probe().eval(), probe_input()
    ws = wb.Workspace(tmp_path_factory.mktemp("ui-arm") / "ws")
    return model, (x,), ws


@pytest.fixture(scope="module")
def ncnn_panel(probe):
    model, inputs, ws = probe
    panel = NcnnPanel(model, inputs, workspace=ws, target="arm64-v8.2")
    panel.run()
    return panel


def _exec(code: str, model, inputs) -> dict:
    ns = {"model": model, "inputs": inputs}
    exec(compile(code, "<panel code>", "exec"), ns)
    return ns


def test_the_target_choice_is_this_machine_and_each_arm_target_by_what_it_stands_for(probe):
    model, inputs, ws = probe
    for panel, dropdown in ((p := NcnnPanel(model, inputs, workspace=ws), p.target),
                            (c := ComparePanel(model, inputs, [], workspace=ws), c.target)):
        values = [v for _, v in dropdown.options]
        assert values == [None, *TARGETS] and dropdown.value is None
        labels = dict((v, label) for label, v in dropdown.options)
        for name, t in TARGETS.items():
            assert labels[name] == f"{name}: {t.stands_for}"
        assert "target=" not in panel.code()  # nothing chosen: the code is as before
    assert "fp16-storage" in c.ncnn_precision.options
    with pytest.raises(InputError, match="unknown ARM target 'arm64-v9'"):
        NcnnPanel(model, inputs, workspace=ws, target="arm64-v9")
    with pytest.raises(InputError, match="unknown ARM target"):
        ComparePanel(model, inputs, [], workspace=ws, target="pixel")


def test_the_ncnn_panel_checks_the_converted_model_on_the_target(ncnn_panel, probe):
    model, inputs, _ = probe
    panel = ncnn_panel
    assert panel.error is None, panel.result_html.value
    nc = panel.artifact
    assert nc is not None and nc.format == "ncnn" and nc.ok  # this machine's check passes
    fp32, fp16 = panel.target_runs
    assert (fp32.target, fp32.flags, fp32.ok, fp32.max_abs) == ("arm64-v8.2", "fp32", True, 0.0)
    assert (fp16.flags, fp16.ok, fp16.nonfinite) == ("fp16 arithmetic", False, 1)
    html = panel.result_html.value
    assert "on arm64-v8.2</b>" in html and "ARMv8.2 phone" in html
    assert html.count("wb-target-run") == 2 and "data-ok='false'" in html
    assert "hint: inf/NaN under fp16 arithmetic" in html
    # Show code writes the target and runs as it is
    code = panel.code()
    assert "on_target(nc, 'arm64-v8.2', model, inputs, precisions=('fp32', 'fp16'))" in code
    ns = _exec(code, model, inputs)
    runs = ns["runs"]
    assert [(r.precision, r.flags, r.ok) for r in runs] == [
        ("fp32", "fp32", True), ("fp16", "fp16 arithmetic", False)]
    assert ns["nc"].id != nc.id  # its own conversion
    # one precision chosen: the code says so
    panel.target_precisions.value = ("fp16",)
    assert "precisions=('fp16',)" in panel.code()
    panel.target.value = None
    assert "on_target" not in panel.code() and panel.target_precisions.layout.display == "none"


def test_the_compare_panel_runs_its_ncnn_candidates_on_the_target(ncnn_panel, probe):
    model, inputs, ws = probe
    nc = ncnn_panel.artifact
    panel = ComparePanel(model, inputs, [nc], workspace=ws, mode="both", target="arm64-v8.2",
                         ncnn_precision="fp16")
    rep = panel.run()
    assert panel.error is None, panel.result_html.value
    (name,) = [c.name for c in rep.candidates]
    assert name == f"ncnn fp16 arithmetic arm64-v8.2 {nc.id}"
    assert not rep.ok and rep.first_divergence.reference == "fc"
    assert rep.fp16_unsafe().layers == ["linear_0"]
    assert panel.compared == [nc]  # the artifacts, as the pipeline reads them
    assert "65504" in panel.result_html.value
    code = panel.code()
    assert ("wb.runtime.NcnnRunner(cand0, precision='fp16', target='arm64-v8.2')" in code)
    ns = _exec(code, model, inputs)
    assert [c.name for c in ns["rep"].candidates] == [name] and not ns["rep"].ok
    # the feature-mask fix, compared there through the panel
    fixed = wb.ncnn_featmask(nc, ["linear_0"], fp16_arithmetic=False)
    panel.set_candidates([fixed])
    rep2 = panel.run()
    assert rep2 is not None and rep2.ok, panel.result_html.value
    # this machine, fp32: the candidates as artifacts again, no runner in the code
    panel.target.value, panel.ncnn_precision.value = None, "fp32"
    assert "NcnnRunner" not in panel.code()


def test_a_missing_arm_environment_is_the_hinted_error_in_the_panel(probe, ncnn_panel,
                                                                     tmp_path, monkeypatch):
    model, inputs, ws = probe
    monkeypatch.setenv("WORKBENCH_ARM64", str(tmp_path / "nothing"))
    panel = NcnnPanel(model, inputs, workspace=ws, target="arm64-v8.2")
    n_before = len(ws)
    assert panel.run() is None  # Run never raises
    assert isinstance(panel.error, InputError)
    html = panel.result_html.value
    assert "the ARM target is not installed" in html and "make arm-target" in html
    assert len(ws) == n_before  # refused before converting
    cmp_panel = ComparePanel(model, inputs, [ncnn_panel.artifact], workspace=ws,
                             target="arm64-v8.6")
    assert cmp_panel.run() is None and "make arm-target" in cmp_panel.result_html.value
