"""`workbench report` in a real browser (headless Debian Chromium): the report of a sweep is
one file that loads nothing from anywhere, renders the coverage matrix coloured by status,
its failed cells link to their errors and hints, hostile text stays text, the plots render,
and the diff against an earlier sweep names what was fixed. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import shutil

import pytest
from browser_harness import ARTIFACTS, launched_browser
from test_sweep import FACTORIES

import workbench as wb
from workbench.cli import main


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Sweep A (flaky fails) and B: A's folder swept again with flaky fixed (--retry-failed)."""
    base = tmp_path_factory.mktemp("report")
    nets = base / "nets.py"
    nets.write_text(FACTORIES)
    models = [f"{nets}:tiny", f"{nets}:flaky"]
    a, b = base / "a", base / "b"
    wb.sweep(models, {"exporter": ["torchscript"]}, workspace=a, progress=False)
    shutil.copytree(a, b)
    (base / "fixed").write_text("")
    wb.sweep(models, {"exporter": ["torchscript"]}, workspace=b, progress=False,
             retry_failed=True)
    return a, b


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    with launched_browser(tmp_path_factory.mktemp("chromium-profile")) as context:
        p = context.new_page()
        p.requests, p.dialogs, p.errors = [], [], []
        p.on("request", lambda r: p.requests.append(r.url))
        p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))
        p.on("pageerror", lambda e: p.errors.append(str(e)))
        yield p


def test_the_report_renders_links_to_errors_and_keeps_hostile_text_as_text(sweeps, page,
                                                                             tmp_path, capsys):
    a, _ = sweeps
    out = tmp_path / "report.html"
    assert main(["report", str(a), "-o", str(out)]) == 0
    assert "2 cells, 1 failed" in capsys.readouterr().out
    page.goto(out.as_uri())
    rows = page.locator("table.coverage tr[id^='cell-']")
    assert rows.count() == 2
    statuses = {r.locator("td").first.inner_text(): [
        td.get_attribute("data-status") for td in r.locator("td.st").all()]
        for r in rows.all()}
    assert statuses["tiny"] == ["ok"] * 6
    assert statuses["flaky"] == ["failed"] + ["skipped"] * 5
    failed = page.locator("tr[id^='cell-flaky'] td.st.failed")
    ok_color = page.locator("tr[id^='cell-tiny'] td.st.ok").first.evaluate(
        "e => getComputedStyle(e).backgroundColor")
    assert failed.evaluate("e => getComputedStyle(e).backgroundColor") != ok_color
    failed.locator("a").click()  # the failed cell links to its error and hint
    target = page.evaluate("location.hash")
    assert target.startswith("#err-flaky")
    section = page.locator(target)
    assert section.is_visible() and section.evaluate(
        "e => e.getBoundingClientRect().top < window.innerHeight")
    text = section.inner_text()
    assert "InputError" in text and "flaky() raised RuntimeError" in text and "hint:" in text
    assert "<img src=x onerror=alert(1)>" in text  # shown as text...
    assert page.locator("img[src='x']").count() == 0 and not page.dialogs  # ...never run
    plot = page.locator("img.plot").first  # tiny's op-by-op errors
    assert plot.evaluate("e => e.complete && e.naturalWidth > 100")
    assert "tiny" in page.locator("figcaption").first.inner_text()
    assert page.locator("#tool-versions td", has_text="onnxruntime").count() == 1
    assert all(u.startswith(("file:", "data:")) for u in page.requests), page.requests
    assert not page.errors
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "sweep-report.png"), full_page=True)


def test_the_report_against_an_earlier_sweep_names_what_was_fixed(sweeps, page, tmp_path,
                                                                  capsys):
    a, b = sweeps
    out = tmp_path / "diff.html"
    assert main(["report", str(b), "-o", str(out), "--against", str(a), "--json"]) == 0
    assert '"failed": 0' in capsys.readouterr().out
    page.goto(out.as_uri())
    changes = page.locator("table.changes tr.improved")
    assert changes.count() == 1
    cells = [td.inner_text() for td in changes.first.locator("td").all()]
    assert cells[0] == "flaky" and cells[2] == "model" and cells[3] == "improved"
    assert cells[4].startswith("failed") and cells[5] == "ok"
    assert page.locator("table.changes tr.broke").count() == 0
    assert "0 broke, 1 improved" in page.locator("#diff + p").inner_text()
    page.screenshot(path=str(ARTIFACTS / "sweep-report-diff.png"), full_page=True)
