"""The workbench against PNNX's own ncnn test corpus (``tools/pnnx/tests/ncnn`` of Tencent/ncnn).

The corpus is read at run time, never copied into the project: ``--ncnn PATH`` or the
environment variable ``WB_NCNN_SRC`` names a Tencent/ncnn work tree or a bare git directory
(from a git directory, ``git archive HEAD tools/pnnx/tests/ncnn`` is extracted into a temporary
directory). With neither, the bench says how to get it and exits 0 (it is not run in CI).

Each case ``test_*.py`` runs in a child process of its own (at most two at once), so a crash,
a hang (``--timeout``) or an import failure of one case cannot take the bench down. The
children are forked from a multiprocessing forkserver that has torch and the workbench imported
(a fresh process per case, without ~6 s of imports each); each makes itself a process group,
killed whole (with its ncnn worker and pnnx) on a timeout. The child (bench/_corpus_case.py)
imports the case and calls its ``test()`` with ``torch.jit.trace`` patched to record
``(model, example_inputs)`` and stop the test there with a sentinel: the model and the inputs
are the ones the test made, seeded as it seeds (only the first traced model of a case is
taken; a few cases trace a second, batched variant after it). Then, through the workbench:

    art = wb.to_ncnn(model, inputs, workspace=...)
    got = wb.runtime.NcnnRunner(art).run(inputs)          # outputs in the order returned

against the torch model's outputs (flattened in order), compared as the case's own test()
compares: ``torch.equal`` where it uses that, else ``torch.allclose(a, b, rtol, atol)`` with
its tolerance (1e-4 for most; 1e-3, 1e-2 or 1e-6 in some), ``reshape_as`` only where the case
reshapes (torch.allclose broadcasts, so ncnn's [1] passes against torch's 0-d []; such cases
are counted). A case passes when every output matches; another output count, or a shape that
does not broadcast, is a mismatch (grouped: out of order, shape only, values); the inputs a
workbench step writes into are recorded. On every passing case ``wb.compare(model, [art], inputs)`` records the aligned
fraction, ``rep.ok`` and how many candidate tensors were aligned / attributed / unexplained
(attributed: where the Alignment has it; otherwise "-").

Outcomes: pass; mismatch (outputs differ); refused (an error raised by to_ncnn, the runner
or the capture of the case; listed with its class, first line and whether it has a hint);
needs torchvision/torchaudio (not installable here); crashed (the child died by a signal,
or ncnn crashed in the worker: BackendCrashed); timeout (the case, or BackendTimeout); skipped (test() returned without
tracing a model, e.g. a torch-version gate).

Targets (issue 16): >= 232 of 246 pass; every other case a hinted error naming its real
cause; on passing cases aligned >= 0.9. It is a report, not a test: the exit status is 0.

Run:  cd /work/main && .venv/bin/python bench/pnnx_corpus.py --ncnn /path/to/ncnn
      [--cases PATTERN] [--limit N] [--jobs 2] [--timeout S] [--json OUT]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from _common import engine_state  # bench/ is on sys.path
from _corpus_case import reason_group

CORPUS = "tools/pnnx/tests/ncnn"
TOTAL = 246  # cases in the corpus the targets were set on
TARGET_PASS = 232
TARGET_ALIGNED = 0.9
OUTCOMES = ("pass", "mismatch", "refused", "needs torchvision/torchaudio", "crashed",
            "timeout", "skipped")
HOW_TO_GET = """\
bench/pnnx_corpus: no ncnn source given; skipped.
The bench reads PNNX's test corpus (tools/pnnx/tests/ncnn) from a Tencent/ncnn checkout:
    git clone --depth 1 https://github.com/Tencent/ncnn /tmp/ncnn
    .venv/bin/python bench/pnnx_corpus.py --ncnn /tmp/ncnn     # or WB_NCNN_SRC=/tmp/ncnn
A bare git directory works too (the corpus is extracted with git archive)."""


# -- the corpus -----------------------------------------------------------------------------------
def corpus_dir(src: Path, tmp: Path) -> Path:
    """The corpus folder of a work tree, or extracted from a (bare) git directory into tmp."""
    if (src / CORPUS).is_dir():
        return src / CORPUS
    if src.name == "ncnn" and src.parent.name == "tests" and src.is_dir():
        return src  # the corpus folder itself
    git_dir = src / ".git" if (src / ".git").exists() else src
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "HEAD", CORPUS],
                             capture_output=True)
    if archive.returncode != 0 or not archive.stdout:
        raise SystemExit(f"bench/pnnx_corpus: {src} is neither an ncnn work tree nor a git "
                         f"directory holding {CORPUS}: "
                         f"{archive.stderr.decode(errors='replace').strip()[:300]}")
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    return tmp / CORPUS


PRELOAD = ["numpy", "torch", "tqdm", "workbench", "workbench.errors", "workbench.stages.ncnn",
           "workbench.runtime", "workbench.runtime.remote", "workbench.comparison",
           "workbench.comparison.metrics", "_corpus_case"]


def case_context() -> Any:
    """A forkserver with torch and the workbench imported: each case is a fresh process forked
    from it (isolated, as a process of its own would be, without the imports' seconds)."""
    import multiprocessing

    os.environ["OMP_NUM_THREADS"] = "1"  # two cases at once on two cores; pnnx reads it too
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _kill_group(pid: int) -> None:
    try:  # the case and whatever it left running in its group (its ncnn worker, a pnnx)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def spawn_case(ctx: Any, path: Path, timeout: float) -> dict[str, Any]:
    """One case in a fresh process (its own process group); killed whole on a timeout."""
    import _corpus_case

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wb-corpus-case-") as scratch:
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_corpus_case.child_entry, args=(str(path), scratch, send),
                           name=path.stem, daemon=True)
        proc.start()
        send.close()
        res = None
        try:
            if receive.poll(timeout):
                try:
                    res = json.loads(receive.recv())
                except EOFError:  # the process died before sending
                    pass
            else:
                _kill_group(proc.pid)
                proc.kill()
                proc.join()
                return {"case": path.stem, "outcome": "timeout",
                        "seconds": time.perf_counter() - t0,
                        "error": {"stage": "-", "class": "timeout", "workbench_error": False,
                                  "first_line": f"no result in {timeout:g} s", "hint": ""}}
            proc.join(30)
        finally:
            receive.close()
            _kill_group(proc.pid)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if res is not None:
            res["seconds"] = time.perf_counter() - t0
            return res
        code = proc.exitcode
        how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit status {code}")
        log = Path(scratch, "case.log")
        tail = ([ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
                if log.exists() else [])
    return {"case": path.stem, "outcome": "crashed", "seconds": time.perf_counter() - t0,
            "error": {"stage": "-", "class": "crash", "workbench_error": False,
                      "first_line": f"the case process died ({how}) without a result",
                      "hint": "", "stderr_tail": tail}}


# -- the report -----------------------------------------------------------------------------------
def cut(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def mismatch_note(results: list[dict[str, Any]]) -> str:
    """How many mismatches to_ncnn flagged with a hinted error diagnostic (the user is told,
    on the artifact) and how many came back silently (a wrong answer: what the target
    forbids)."""
    mism = [r for r in results if r["outcome"] == "mismatch"]
    flagged = [r for r in mism if any(f.get("hint") for f in r["mismatch"].get("flagged", []))]
    if not mism:
        return "no mismatch"
    return (f"mismatches: {len(flagged)} of {len(mism)} flagged by to_ncnn with a hinted "
            "error diagnostic (" + ", ".join(
                f"{r['case']}: {r['mismatch']['flagged'][0]['code']}" for r in flagged[:3])
            + f"), {len(mism) - len(flagged)} silent")


def failure_group(r: dict[str, Any]) -> str:
    """A failure's kind with its names, shapes and numbers blanked, so alike causes group."""
    if r["outcome"] == "mismatch":
        m = r.get("mismatch", {})
        if m.get("passes_in_out_order"):
            return "mismatch: outputs out of order (out0..outN order would pass)"
        if m.get("passes_reshaped"):
            return "mismatch: output shape only (values pass reshaped)"
        detail = m.get("detail", "")
        if "outputs" in detail.split(";")[0] and "vs torch" in detail.split(";")[0]:
            return "mismatch: output count"
        if "shape" in detail:
            return "mismatch: output shape"
        return "mismatch: values"
    e = r.get("error") or {}
    if r["outcome"] in ("needs torchvision/torchaudio", "timeout", "skipped"):
        return r["outcome"]
    cause = (e.get("pnnx_log_reasons") or [None])[0] or e.get("cause")
    what = reason_group(cause) if cause else reason_group(e.get("first_line", ""))
    return f"{r['outcome']} [{e.get('stage')}] {e.get('class')}: {cut(what, 110)}"


def print_report(results: list[dict[str, Any]], wall: float, jobs: int, found: int) -> None:
    """Failing cases, causes grouped, totals, alignment figures, and the verdict line
    (``found``: cases in the corpus, of which ``results`` may be a selection)."""
    results = sorted(results, key=lambda r: r["case"])
    n = len(results)
    failing = [r for r in results if r["outcome"] != "pass"]
    if failing:
        rows = [("case", "outcome", "stage", "error class", "message (first line)", "hint")]
        for r in failing:
            e = r.get("error") or {}
            if r["outcome"] == "mismatch":
                rows.append((r["case"], "mismatch", "check", "-",
                             cut(r.get("mismatch", {}).get("detail", ""), 90), "-"))
                continue
            rows.append((r["case"], r["outcome"], str(e.get("stage", "-")),
                         str(e.get("class", "-")), cut(e.get("first_line", ""), 90),
                         "-" if r["outcome"] in ("needs torchvision/torchaudio", "skipped")
                         else "yes" if e.get("hint") else "no"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        print(f"failing cases ({len(failing)}):")
        for i, row in enumerate(rows):
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
            if i == 0:
                print("  ".join("-" * w for w in widths))
        print()
        groups: dict[str, list[str]] = defaultdict(list)
        for r in failing:
            groups[failure_group(r)].append(r["case"])
        print("failure causes, grouped:")
        for g, cases in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            more = f", +{len(cases) - 3} more" if len(cases) > 3 else ""
            print(f"  {len(cases):3d}  {g}\n       e.g. {', '.join(cases[:3])}{more}")
        print()

    counts = Counter(r["outcome"] for r in results)
    errors = [r for r in results if r["outcome"] in ("refused", "crashed")]
    hinted = sum(1 for r in errors if (r.get("error") or {}).get("hint"))
    print(f"totals over {n} case(s): " + ", ".join(f"{o} {counts.get(o, 0)}" for o in OUTCOMES
                                                 if counts.get(o, 0) or o != "skipped"))
    logged = [r for r in errors if (r.get("error") or {}).get("pnnx_log_reasons")]
    print(f"errors with a hint: {hinted}/{len(errors)} refused or crashed "
          f"({sum(1 for r in errors if (r.get('error') or {}).get('cause'))} quote a pnnx "
          f"reason; of {len(logged)} whose kept pnnx.log gives one, "
          f"{sum(1 for r in logged if r['error'].get('names_pnnx_reason'))} name it); "
          + mismatch_note(results))
    passing = [r for r in results if r["outcome"] == "pass"]
    diag_cases = [r["case"] for r in passing if any(d.startswith("error")
                                                    for d in r.get("to_ncnn_diagnostics", []))]
    if diag_cases:
        print(f"passing cases whose to_ncnn check still raised an error diagnostic: "
              f"{len(diag_cases)} (e.g. {', '.join(diag_cases[:3])})")
    mutating = [f"{r['case']} ({', '.join(r['inputs_mutated_by'])})" for r in results
                if r.get("inputs_mutated_by")]
    if mutating:
        print(f"cases whose inputs a workbench step changed (restored before the next step): "
              f"{len(mutating)}: {', '.join(mutating[:4])}")
    reshaped = [r["case"] for r in passing if r.get("other_shapes")]
    if reshaped:
        print(f"passing cases with an output shape other than torch's (passed as the case's "
              f"torch.allclose broadcasts, e.g. [1] against []): {len(reshaped)} "
              f"(e.g. {', '.join(reshaped[:3])})")
    comp = [r["compare"] for r in passing if "compare" in r]
    comp_err = [r for r in passing if "error" in r.get("compare", {})]
    fracs = [c["aligned_fraction"] for c in comp
             if "error" not in c and c.get("aligned_fraction") is not None]
    if passing:
        def total(key: str) -> str:
            vals = [c.get(key) for c in comp if "error" not in c]
            return "-" if not vals or any(v is None for v in vals) else str(sum(vals))

        not_ok = sum(1 for c in comp if "error" not in c and not c.get("ok"))
        print(f"wb.compare on {len(passing)} passing case(s): {len(comp) - len(comp_err)} "
              f"compared, {len(comp_err)} raised; rep.ok False on {not_ok}; candidate tensors "
              f"aligned {total('aligned')}, attributed {total('attributed')}, unexplained "
              f"{total('unexplained')} (of {total('considered')} considered)")
        not_ok_cases = [r for r in passing if "error" not in r.get("compare", {"error": 1})
                        and not r["compare"].get("ok")]
        if not_ok_cases:
            print("  rep.ok False on: " + "; ".join(
                f"{r['case']} ({cut(r['compare'].get('summary', ''), 100)})"
                for r in not_ok_cases[:4]) + (f"; +{len(not_ok_cases) - 4} more"
                                             if len(not_ok_cases) > 4 else ""))
        if comp_err:
            print("  compare raised on: " + "; ".join(
                f"{r['case']} ({r['compare']['error']['class']}: "
                f"{cut(r['compare']['error']['first_line'], 60)})" for r in comp_err[:5]))
        if fracs:
            low = sorted((c["aligned_fraction"], r["case"]) for r in passing
                         for c in [r.get("compare", {})]
                         if c.get("aligned_fraction") is not None and "error" not in c)
            below = [(f, c) for f, c in low if f < TARGET_ALIGNED]
            print(f"aligned fraction: median {statistics.median(fracs):.3f}, minimum "
                  f"{min(fracs):.3f}, below {TARGET_ALIGNED}: {len(below)} of {len(fracs)}"
                  + (" (lowest: " + ", ".join(f"{c} {f:.3f}" for f, c in below[:5]) + ")"
                     if below else ""))
            reasons: Counter[str] = Counter()
            for c in comp:
                for reason, k in c.get("unexplained_reasons", []):
                    reasons[reason] += k
            if reasons:
                print("  unexplained, most common: " + "; ".join(
                    f"{k}x {cut(g, 90)}" for g, k in reasons.most_common(4)))
    secs = [r.get("seconds", 0.0) for r in results]
    print(f"time: {wall:.0f} s wall for {n} case(s) ({jobs} at a time), "
          f"{statistics.median(secs) if secs else 0:.1f} s median per case, slowest "
          + ", ".join(f"{r['case']} {r.get('seconds', 0):.0f} s"
                      for r in sorted(results, key=lambda r: -r.get("seconds", 0))[:3]))
    print()
    n_pass = counts.get("pass", 0)
    unhinted = len(errors) - hinted
    low_n = sum(1 for f in fracs if f < TARGET_ALIGNED)
    silent = [r for r in results if r["outcome"] == "mismatch" and not any(
        f.get("hint") for f in r.get("mismatch", {}).get("flagged", []))]
    met = (n >= TOTAL and n_pass >= TARGET_PASS and not unhinted
           and len(silent) + counts.get("timeout", 0) == 0 and not low_n)
    subset = ("" if n == found else f" [a selection: {n} of the corpus's {found} cases]")
    if found != TOTAL:
        subset += f" [this corpus holds {found} cases; the targets were set on {TOTAL}]"
    med = f"{statistics.median(fracs):.3f}" if fracs else "-"
    lowest = f"{min(fracs):.3f}" if fracs else "-"
    print(f"bench/pnnx_corpus: {n_pass}/{n} pass (target >= {TARGET_PASS} of {TOTAL}); "
          f"{counts.get('mismatch', 0)} mismatch, {counts.get('refused', 0)} refused, "
          f"{counts.get('needs torchvision/torchaudio', 0)} need torchvision/torchaudio, "
          f"{counts.get('crashed', 0)} crashed, {counts.get('timeout', 0)} timeout"
          + (f", {counts['skipped']} skipped" if counts.get("skipped") else "") + "; "
          f"{unhinted} of {len(errors)} errors without a hint; aligned median {med} min "
          f"{lowest}, {low_n} below {TARGET_ALIGNED} (target >= {TARGET_ALIGNED}); "
          f"{'targets met' if met else 'targets not met'}{subset}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ncnn", help="Tencent/ncnn work tree or git directory "
                        "(default: $WB_NCNN_SRC)")
    parser.add_argument("--cases", help="only cases whose name matches this glob or regex "
                        "(e.g. 'test_F_*' or 'pool')")
    parser.add_argument("--limit", type=int, help="at most N cases (after --cases)")
    parser.add_argument("--jobs", type=int, default=2, help="cases at once (at most 2)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds per case before it counts as a timeout (default 300)")
    parser.add_argument("--json", help="write the per-case results to this file")
    args = parser.parse_args(argv)

    src = args.ncnn or os.environ.get("WB_NCNN_SRC")
    if not src:
        print(HOW_TO_GET)
        return 0
    src_path = Path(src).expanduser()
    if not src_path.exists():
        print(f"bench/pnnx_corpus: {src_path} does not exist.\n{HOW_TO_GET}")
        return 0
    jobs = max(1, min(2, args.jobs))
    from tqdm.auto import tqdm

    with tempfile.TemporaryDirectory(prefix="wb-corpus-src-") as tmp:
        corpus = corpus_dir(src_path, Path(tmp))
        cases = sorted(corpus.glob("test_*.py"))
        found = len(cases)
        if args.cases:
            pat = args.cases
            cases = [c for c in cases if fnmatch.fnmatch(c.stem, pat)
                     or fnmatch.fnmatch(c.name, pat) or re.search(pat, c.stem)]
        if args.limit is not None:
            cases = cases[: args.limit]
        print(f"corpus: {corpus} ({found} cases; running {len(cases)}, {jobs} at a time, "
              f"timeout {args.timeout:g} s each); load average "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}\n{engine_state()}")
        t0 = time.perf_counter()
        results: list[dict[str, Any]] = []
        ctx = case_context()
        with ThreadPoolExecutor(jobs) as pool, tqdm(total=len(cases), desc="cases") as bar:
            futures = {pool.submit(spawn_case, ctx, c, args.timeout): c for c in cases}
            for fut in as_completed(futures):
                try:
                    res = fut.result()
                except Exception as e:  # the bench's own bug: keep the other cases
                    res = {"case": futures[fut].stem, "outcome": "crashed",
                           "error": {"stage": "bench", "class": type(e).__name__,
                                     "workbench_error": False, "first_line": str(e),
                                     "hint": ""}}
                results.append(res)
                bar.set_postfix_str(f"{res['case']}: {res['outcome']}", refresh=False)
                bar.update()
        wall = time.perf_counter() - t0
    if args.json:
        Path(args.json).write_text(json.dumps(sorted(results, key=lambda r: r["case"]),
                                              indent=1, default=str))
        print(f"per-case results: {args.json}")
    print_report(results, wall, jobs, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
