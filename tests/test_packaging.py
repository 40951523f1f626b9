"""The repository's own promises: deps in step, two commands, fast import, CI entry point."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower().replace("_", "-")


def test_environment_yml_and_pyproject_list_the_same_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_norm(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {_norm(r) for r in extra}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_norm(r) for r in pip if not r.startswith("-e")}
    assert listed == declared, (f"only in environment.yml: {listed - declared}; "
                                f"only in pyproject.toml: {declared - listed}")


def test_torch_is_pinned_to_the_cpu_wheel():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in deps
    assert "pip install -q torch==2.13.0" in (ROOT / "Makefile").read_text()


def test_makefile_targets_bootstrap_the_venv():
    text = (ROOT / "Makefile").read_text()
    for target in ("demo", "lab", "test"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{target}:"))
        assert "$(STAMP)" in line or "lint" in line, line
    assert "ruff check" in text and "pytest" in text and "-m venv" in text


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make lab" in text and "make test" in text


def test_import_is_fast_and_lazy():
    probe = ("import sys, time, json\nt = time.perf_counter()\nimport workbench\n"
             "dt = time.perf_counter() - t\n"
             "print(json.dumps([dt, [m for m in ('torch', 'onnx', 'onnxruntime', 'ncnn', "
             "'pnnx', 'numpy') if m in sys.modules]]))")
    dt, heavy = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                          text=True, check=True).stdout)
    assert heavy == []
    assert dt < 1.0


def test_public_api_names_resolve():
    import workbench as wb

    for name in ("export", "simplify", "Workspace", "Artifact", "Diagnostic", "Pipeline",
                 "WorkbenchError", "summarize", "default_model"):
        assert getattr(wb, name) is not None
    assert issubclass(wb.ExportError, wb.WorkbenchError)


def test_wheel_ships_the_browser_widgets(tmp_path):
    import zipfile

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(tmp_path.glob("deploy_workbench-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in ("graphview.js", "graphview.css", "compare_table.js", "vendor/dagre.esm.js",
                "vendor/dagre.LICENSE"):
        assert f"workbench/widgets/{rel}" in names, rel
        assert (ROOT / "widgets" / rel).is_file()
