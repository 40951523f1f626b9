"""``workbench report``: a sweep as one self-contained HTML file a team opens: the coverage
matrix (cells × stages, coloured by status, each linking to its errors and hints), the error
figures, op-by-op plots per model, the diff against an earlier sweep and the tool versions.

No script, no CDN: inline CSS, plots as PNG data URIs, every text escaped, and a
Content-Security-Policy that lets the page load nothing from anywhere.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..fileio import atomic_write_text
from .cell import BAD, INT8_STAGES, STAGES
from .db import CellRecord, SweepDB
from .diff import SweepDiff, diff, tools_of

COLORS = {"ok": "#2e7d32", "mismatch": "#ef6c00", "failed": "#c62828", "crashed": "#6a1b9a",
          "out-of-memory": "#ad1457", "skipped": "#9e9e9e", "off": "#e0e0e0", "pending": "#ffffff"}
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
td.st a{display:block;color:#fff;text-decoration:none;text-align:center;min-width:70px}
td.st{padding:0}td.st a{padding:3px 6px}td.st.off a,td.st.pending a{color:#555}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;color:#fff}
pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;margin:4px 0;max-height:300px;
overflow:auto}.hint{background:#fff8e1;padding:4px 8px}.num{text-align:right;
font-variant-numeric:tabular-nums}.broke{color:#c62828}.improved{color:#2e7d32}
section.err{border-left:4px solid #c62828;padding-left:12px;margin:12px 0}
"""


def write_report(workspace: str | os.PathLike[str], out: str | os.PathLike[str],
                 against: str | os.PathLike[str] | None = None) -> Path:
    """Write the HTML report of the sweep in ``workspace`` to ``out``; with ``against`` (an
    earlier sweep's folder), what changed since it. Returns the path written."""
    with SweepDB(workspace, readonly=True) as db:
        cells, meta = db.cells(), db.meta()
    changes = None
    if against is not None:
        with SweepDB(against, readonly=True) as old:
            changes = diff(old.cells(), cells)
    out = Path(out)
    if out.is_dir():
        raise InputError(f"-o {str(out)!r} is a folder, expected a file name",
                         f"e.g. -o {out / 'report.html'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render(cells, meta, changes, title=str(Path(workspace).absolute()),
                                  against=str(against) if against else None))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out, 0o666 & ~umask)  # a report is for others to open (the temp file was 0600)
    return out


def render(cells: list[CellRecord], meta: dict[str, str], changes: SweepDiff | None = None,
           *, title: str = "sweep", against: str | None = None) -> str:
    """The report as one HTML string."""
    e = _esc
    done = [c for c in cells if c.done]
    failed = [c for c in cells if c.failed]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">",
        f"<title>Sweep report: {e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>Sweep report: {e(title)}</h1>",
        f"<p id='counts'>{len(cells)} cells: {len(done) - len(failed)} ok, {len(failed)} "
        f"failed, {len(cells) - len(done)} not run. Created {e(meta.get('created', '?'))}; "
        f"matrix {e(meta.get('matrix', '?'))}.</p>",
        _matrix(cells), _figures(cells), _errors(cells), _plots(cells),
    ]
    if changes is not None:
        parts.append(_diff(changes, against or "the earlier sweep"))
    parts.append(_tools(cells))
    parts.append("</body></html>")
    return "\n".join(parts)


def matrix_html(cells: list[CellRecord]) -> str:
    """The coverage matrix alone (the notebook's sweep view shows it while the sweep runs)."""
    return f"<style>{CSS}</style>" + _matrix(cells, links=False)


def _matrix(cells: list[CellRecord], links: bool = True) -> str:
    e = _esc
    legend = "".join(f"<span style='background:{c};{'color:#555' if s in ('off', 'pending') else ''}'>"
                     f"{s}</span>" for s, c in COLORS.items())
    stages = shown_stages(cells)
    rows = ["<h2 id='matrix'>Coverage</h2>", f"<p class='legend'>{legend}</p>",
            "<table class='coverage'><tr><th>model</th><th>choices</th>"
            + "".join(f"<th>{s}</th>" for s in stages) + "<th>seconds</th></tr>"]
    for c in cells:
        by = {s.stage: s for s in c.stages}
        tds = []
        for stage in stages:
            s = by.get(stage)
            status = s.status if s else ("pending" if not c.done else "off")
            tip = e(f"{s.error_class}: {s.error}"[:300]) if s and s.error else status
            target = f"#{_anchor(c, stage)}" if s and (s.status in BAD) else f"#fig-{c.cell_id}"
            inner = (f"<a href='{target}' title='{tip}'>{status}</a>" if links
                     else f"<a title='{tip}'>{status}</a>")
            tds.append(f"<td class='st {status}' data-stage='{stage}' data-status='{status}' "
                       f"style='background:{COLORS.get(status, '#fff')}'>{inner}</td>")
        secs = f"{c.seconds:.1f}" if c.seconds is not None else "-"
        rows.append(f"<tr id='cell-{c.cell_id}'><td>{e(c.name)}</td><td>{e(c.label)}</td>"
                    f"{''.join(tds)}<td class='num'>{secs}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _figures(cells: list[CellRecord]) -> str:
    e = _esc
    # a sweep over ARM targets: where each ncnn candidate ran, what ran, its output error there
    arm = any(s.target for c in cells for s in c.stages)
    arm_th = ("<th title='where the candidate ran and the precision features that ran'>ran as"
              "</th><th title='its output check on the ARM target (emulated by QEMU)'>max abs "
              "on target</th>") if arm else ""
    out = ["<h2 id='figures'>Error figures</h2>",
           "<table><tr><th>model</th><th>choices</th><th>stage</th><th>status</th>"
           "<th>nodes</th><th>max abs vs torch</th><th>max abs fp16</th>"
           "<th title='atol + rtol·|torch| per element, by the candidate&#39;s precision'>"
           "tolerance</th><th title='int8: output SNR vs the float model, and its bar'>"
           "SNR dB</th><th>aligned</th>"
           f"<th>first divergence</th>{arm_th}<th>warnings</th><th>seconds</th></tr>"]
    for c in cells:
        first = True
        for s in c.stages:
            if s.status in ("off", "skipped"):
                continue
            anchor = f" id='fig-{c.cell_id}'" if first else ""
            first = False
            out.append(
                f"<tr{anchor}><td>{e(c.name)}</td><td>{e(c.label)}</td><td>{s.stage}</td>"
                f"<td style='color:{COLORS.get(s.status, '#222')}'>{s.status}</td>"
                f"<td class='num'>{_n(s.nodes)}</td><td class='num'>{_g(s.max_abs)}</td>"
                f"<td class='num'>{_g(s.max_abs_fp16)}</td>"
                f"<td class='num tol'>{_tol(s)}</td><td class='num'>{_snr(s)}</td>"
                f"<td class='num'>{_pct(s.aligned_fraction)}</td>"
                f"<td>{e(s.first_divergence)}</td>{_ran_as(s) if arm else ''}"
                f"<td class='num'>{_n(s.warnings)}</td>"
                f"<td class='num'>{s.seconds:.2f}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _ran_as(s: Any) -> str:
    """The two target cells of a figures row: 'fp16 arithmetic on arm64-v8.2', its max abs."""
    where = f" on {s.target}" if s.target else (" here" if s.flags else "")
    return (f"<td class='ran'>{_esc(s.flags + where)}</td>"
            f"<td class='num'>{_g(s.target_max_abs)}</td>")


def _errors(cells: list[CellRecord]) -> str:
    e = _esc
    out = ["<h2 id='errors'>Errors and hints</h2>"]
    for c in cells:
        for s in c.stages:
            if s.status not in BAD:
                continue
            out.append(f"<section class='err' id='{_anchor(c, s.stage)}'>"
                       f"<h3>{e(c.name)} · {e(c.label)} · {s.stage}: {s.status}</h3>"
                       f"<p><b>{e(s.error_class)}</b></p><pre>{e(s.error)}</pre>"
                       f"<p class='hint'>hint: {e(s.hint) or '-'}</p>"
                       f"<p>artifacts: {e(c.folder) or '-'} · "
                       f"<a href='#cell-{c.cell_id}'>back to the matrix</a></p></section>")
    if len(out) == 1:
        out.append("<p>No stage failed.</p>")
    return "\n".join(out)


def _plots(cells: list[CellRecord]) -> str:
    """One figure per model: max abs error against op order, a line per cell and candidate."""
    by_model: dict[str, list[CellRecord]] = defaultdict(list)
    for c in cells:
        if c.ops:
            by_model[c.name].append(c)
    out = ["<h2 id='plots'>Op by op</h2>"]
    if not by_model:
        out.append("<p>No comparison ran.</p>")
        return "\n".join(out)
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    for model, group in by_model.items():
        fig = Figure(figsize=(9, 3.2), dpi=80)
        ax = fig.add_subplot()
        for c in group:
            lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
            for o in c.ops:
                if o.max_abs is not None:
                    lines[o.candidate].append((o.order, max(o.max_abs, 1e-12)))
            for cand, pts in lines.items():
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
                        label=f"{c.label} · {cand}"[:90])
        ax.set_yscale("log")
        ax.set_xlabel("op (topological order)")
        ax.set_ylabel("max abs vs torch")
        ax.set_title(model)
        ax.legend(fontsize=6, loc="upper left")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        data = base64.b64encode(buf.getvalue()).decode()
        out.append(f"<figure><img class='plot' alt='{_esc(model)}: error per op' "
                   f"src='data:image/png;base64,{data}'><figcaption>{_esc(model)}"
                   "</figcaption></figure>")
    return "\n".join(out)


def _diff(changes: SweepDiff, against: str) -> str:
    e = _esc
    out = [f"<h2 id='diff'>Since {e(against)}</h2>",
           f"<p>{len(changes.broke)} broke, {len(changes.improved)} improved, "
           f"{len(changes.changes)} change(s) in all.</p>"]
    if changes.changes:
        out.append("<table class='changes'><tr><th>model</th><th>choices</th><th>stage</th>"
                   "<th>change</th><th>before</th><th>after</th></tr>")
        for c in changes.changes:
            cls = c.kind.split()[0]
            out.append(f"<tr class='{cls}'><td>{e(c.model)}</td><td>{e(c.label)}</td>"
                       f"<td>{e(c.stage)}</td><td class='{cls}'>{e(c.kind)}</td>"
                       f"<td>{e(c.before)}</td><td>{e(c.after)}</td></tr>")
        out.append("</table>")
    if changes.tools:
        out.append("<p>Tool versions that moved:</p><table><tr><th>tool</th><th>before</th>"
                   "<th>after</th></tr>" + "".join(
                       f"<tr><td>{e(t)}</td><td>{e(a)}</td><td>{e(b)}</td></tr>"
                       for t, (a, b) in changes.tools.items()) + "</table>")
    return "\n".join(out)


def _tools(cells: list[CellRecord]) -> str:
    rows = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>"
                   for k, v in tools_of(cells).items())
    return (f"<h2 id='tools'>Tool versions</h2><table id='tool-versions'><tr><th>tool</th>"
            f"<th>version</th></tr>"
            f"{rows}</table>")


def shown_stages(cells: list[CellRecord]) -> list[str]:
    """The matrix's stage columns: the int8 ones only when the sweep crosses precision (from
    the start, while its cells are pending) or some stored cell ran them."""
    used = {s.stage for c in cells for s in c.stages if s.status != "off"}
    if any(c.choices.get("precision", "fp32") != "fp32" for c in cells):
        used |= set(INT8_STAGES)
    return [s for s in STAGES if s not in INT8_STAGES or s in used]


def _tol(s: Any) -> str:
    atol, rtol = getattr(s, "atol", None), getattr(s, "rtol", None)
    return "-" if atol is None or rtol is None else f"atol {atol:g}, rtol {rtol:g}"


def _snr(s: Any) -> str:
    snr, bar = getattr(s, "snr_db", None), getattr(s, "min_snr_db", None)
    if snr is None and bar is None:
        return "-"
    return f"{'-' if snr is None else f'{snr:.1f}'} (&ge; {bar:g})" if bar is not None \
        else f"{snr:.1f}"


def _anchor(c: CellRecord, stage: str) -> str:
    return f"err-{c.cell_id}-{stage}"


def _esc(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"
