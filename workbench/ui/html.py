"""The HTML pieces the panels show: an artifact's summary, diagnostics, an error with its hint,
an op histogram, a block of code. Plain strings, no widget: usable headless and in tests."""

from __future__ import annotations

import html
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..diagnostics import group_diagnostics
from ..errors import WorkbenchError

if TYPE_CHECKING:
    from ..artifact.record import Artifact

LEVEL_COLOURS = {"error": "#c62828", "warning": "#ef6c00", "info": "#546e7a"}


def esc(x: Any) -> str:
    """``x`` as text, escaped for HTML."""
    return html.escape(str(x))


def code_block_html(code: Callable[[], str]) -> str:
    """The engine calls ``code()`` writes, as a selectable block; an error there becomes a
    comment in the block (showing code never breaks a panel)."""
    try:
        text = code()
    except Exception as e:  # noqa: BLE001
        text = f"# cannot write the code: {e}"
    return (f"<pre class='wb-code' style='background:#f6f8fa;padding:6px;user-select:text'>"
            f"{esc(text)}</pre>")


def diagnostics_html(diags: list[Any]) -> str:
    """Diagnostics as a list, grouped (diagnostics.group_diagnostics): the user's own problems
    first, by level, with their hints; repeats and library-internal warnings one line each
    with a count, folded under one summary; site-packages paths shortened."""
    if not diags:
        return "<div><i>no diagnostics</i></div>"
    view = group_diagnostics(diags)
    items = [_own_item(g) for g in view.own]
    if view.internal:
        items.append(_internal_item(view.internal))
    return ("<ul class='wb-diagnostics' style='margin:0;padding-left:1.2em'>" + "".join(items)
            + "</ul>")


def _own_item(g: Any) -> str:
    """One group of the user's own diagnostics: level, code, count, sources, message, hint."""
    colour = LEVEL_COLOURS.get(g.level, "#333")
    hint = f"<div style='margin-left:1em'>hint: {esc(g.hint)}</div>" if g.hint else ""
    times = f" <span class='wb-diag-count'>×{g.count}</span>" if g.count > 1 else ""
    where = f" [{esc(', '.join(g.sources))}]" if g.sources else ""
    return (f"<li class='wb-diag wb-diag-{esc(g.level)}'>"
            f"<b style='color:{colour}'>{esc(g.level)}</b> "
            f"<code>{esc(g.code)}</code>{times}{where}: "
            f"<span style='white-space:pre-wrap'>{esc(g.message)}</span>{hint}</li>")


def _internal_item(internal: list[Any]) -> str:
    """Library-internal diagnostics, one line each, folded under one summary."""
    n = sum(g.count for g in internal)
    libs = sorted({g.package for g in internal if g.package})
    lines = "".join(f"<li class='wb-diag wb-diag-internal' title='{esc(g.message)}'>"
                    f"{esc(g.line())}</li>" for g in internal)
    return (f"<li class='wb-diag-internal-group' style='color:#78909c'><details>"
            f"<summary>{n} from library internals ({esc(', '.join(libs))}), "
            f"{len(internal)} distinct: nothing to change in your model"
            f"</summary><ul style='padding-left:1.2em'>{lines}</ul></details></li>")


def error_html(e: BaseException) -> str:
    """An error with its hint, as the panel shows it."""
    message = getattr(e, "message", None) or str(e)
    hint = getattr(e, "hint", "")
    if not isinstance(e, WorkbenchError):
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])
        hint = hint or ("an unexpected error inside the stage (the kernel is fine); the last "
                        "frames are below: please report it")
        message = f"{type(e).__name__}: {message}\n{tb}"
    return (f"<div class='wb-error' style='border-left:4px solid #c62828;padding:4px 8px;"
            f"background:#fdecea'><b>{esc(type(e).__name__)}</b>: "
            f"<span style='white-space:pre-wrap'>{esc(message)}</span>"
            + (f"<div class='wb-hint'><b>hint:</b> <span style='white-space:pre-wrap'>"
               f"{esc(hint)}</span></div>" if hint else "") + "</div>")


def histogram_html(ops: dict[str, int], title: str = "ops") -> str:
    """An op histogram as horizontal bars (the preview when no graph view is available)."""
    if not ops:
        return "<i>no ops</i>"
    top = max(ops.values())
    rows = []
    for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
        w = max(2, int(160 * n / top))
        rows.append(f"<tr><td style='text-align:right;padding-right:6px'><code>{esc(op)}</code>"
                    f"</td><td><div style='background:#5c6bc0;height:10px;width:{w}px;"
                    f"display:inline-block'></div> {n}</td></tr>")
    return (f"<div class='wb-histogram'><b>{esc(title)}</b>"
            f"<table style='font-size:12px'>{''.join(rows)}</table></div>")


def artifact_html(art: Artifact, before: Any = None) -> str:
    """Summary, node counts before/after, metrics and diagnostics of one artifact."""
    g = art.graph
    parts = [f"<div class='wb-summary'><b>{esc(art.summary())}</b></div>"]
    if before is not None:
        parts.append(f"<div class='wb-nodes'>nodes: {before.node_count} &rarr; {g.node_count}"
                     "</div>")
    io = ", ".join(esc(t) for t in g.inputs) + " &rarr; " + ", ".join(esc(t) for t in g.outputs)
    parts.append(f"<div class='wb-io'>{io}</div>")
    shown = {k: v for k, v in art.metrics.items() if isinstance(v, (int, float, str))}
    if shown:
        cells = "".join(f"<tr><td>{esc(k)}</td><td>{esc(_fmt(v))}</td></tr>"
                        for k, v in shown.items())
        parts.append(f"<table class='wb-metrics' style='font-size:12px'>{cells}</table>")
    parts.append(diagnostics_html(art.diagnostics))
    return "".join(parts)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
