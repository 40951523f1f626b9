"""Real-browser test harness: a JupyterLab server on loopback and Debian Chromium via Playwright.

Use it from a test file with ``from browser_harness import lab, lab_server, browser  # noqa``
(pytest puts ``tests/`` on ``sys.path``); the fixtures are module-scoped, so one test file
starts one server and one browser. The server listens on 127.0.0.1 with a non-root
``base_url`` (``/wb/``) so that widgets which address the server relatively are exercised,
a token, a temp root dir and a ``python3`` kernel spec for this interpreter. Screenshots go to
``test-artifacts/`` at the repository root, which the test run keeps (``make clean`` drops it).

Nothing is skipped: a missing Chromium or Playwright fails with a message that ``make test``
installs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-quic", "--no-first-run", "--disable-component-update",
                 "--disable-sync"]
BASE_URL = "/wb/"
KERNEL = "python3"
SERVER_START_TIMEOUT = 60.0
INSTALL_HINT = ("`make test` installs them (pip extra `dev` has playwright; the Makefile runs "
                "`apt-get install -y chromium` when /usr/bin/chromium is missing)")

# User settings for the test server: all cells attached to the DOM (JupyterLab 4 windows
# off-screen cells away otherwise, and the tests read outputs), the notebook's kernel started
# without the "Select Kernel" dialog, and no news fetch.
USER_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "windowingMode": "none", "autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}


def _free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    """A running JupyterLab: where it serves, its token and the folder it serves."""

    port: int
    token: str
    root_dir: Path
    log_path: Path
    process: subprocess.Popen = field(repr=False)
    base_url: str = BASE_URL

    @property
    def url(self) -> str:
        """The server's base URL, ending with ``/``."""
        return f"http://127.0.0.1:{self.port}{self.base_url}"

    def api(self, path: str, method: str = "GET", timeout: float = 5.0) -> Any:
        """Call the server's REST API with the token; returns the decoded JSON (or None)."""
        req = urllib.request.Request(f"{self.url}{path.lstrip('/')}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def log(self) -> str:
        """The server's output so far (for failure messages)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def write_notebook(self, name: str, cells: list[str]) -> Path:
        """Write a notebook of code cells (python3 kernel) into the served folder."""
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3",
                                     "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        path = self.root_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        return path


def _write_kernelspec(jupyter_path: Path) -> None:
    """A ``python3`` kernel spec that starts this interpreter (first on JUPYTER_PATH)."""
    spec_dir = jupyter_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 ({sys.executable})", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")


def start_lab_server(base: Path) -> LabServer:
    """Start JupyterLab on loopback under ``base`` and wait until its API answers."""
    root_dir, jpath, config_dir, settings_dir = (base / d for d in
                                                 ("root", "jupyter", "config", "settings"))
    for d in (root_dir, jpath, config_dir, settings_dir, base / "workspaces"):
        d.mkdir(parents=True, exist_ok=True)
    _write_kernelspec(jpath)
    for rel, value in USER_SETTINGS.items():
        target = settings_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(value), encoding="utf-8")
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.pathsep.join([str(jpath), *filter(None, [env.get("JUPYTER_PATH")])])
    env["JUPYTER_CONFIG_DIR"] = str(config_dir)
    env["JUPYTER_RUNTIME_DIR"] = str(base / "runtime")
    env.pop("JUPYTER_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    port, token = _free_port(), secrets.token_hex(16)
    log_path = base / "server.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--ServerApp.base_url={BASE_URL}", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root_dir}", "--ServerApp.open_browser=False",
           "--no-browser", f"--LabApp.user_settings_dir={settings_dir}",
           f"--LabApp.workspaces_dir={base / 'workspaces'}", "--ServerApp.allow_remote_access=False",
           "--ServerApp.terminals_enabled=False"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    server = LabServer(port=port, token=token, root_dir=root_dir, log_path=log_path, process=proc)
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{server.log()}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            server.api("api/status", timeout=2.0)
            return server
        time.sleep(0.25)
    stop_lab_server(server)
    raise RuntimeError(f"JupyterLab did not answer within {SERVER_START_TIMEOUT:.0f} s:\n"
                       f"{server.log()}")


def stop_lab_server(server: LabServer) -> None:
    """Shut the server down through its API (kernels too); terminate it if that fails."""
    if server.process.poll() is None:
        with contextlib.suppress(OSError, urllib.error.URLError):
            server.api("api/shutdown", method="POST")
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.terminate()
            try:
                server.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()


def require_browser() -> None:
    """Fail (never skip) when Playwright or Chromium is missing, saying how to get them."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the browser tests need the Python package `playwright` ({exc}); "
                    f"{INSTALL_HINT}", pytrace=False)
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"the browser tests need Debian Chromium at {CHROMIUM}; {INSTALL_HINT}",
                    pytrace=False)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """One JupyterLab server per test module, shut down at the end."""
    server = start_lab_server(tmp_path_factory.mktemp("lab"))
    try:
        yield server
    finally:
        stop_lab_server(server)


class Lab:
    """A browser page on the test server, with the steps the browser tests repeat."""

    def __init__(self, server: LabServer, context: Any, artifacts: Path = ARTIFACTS):
        self.server = server
        self.context = context
        self.artifacts = artifacts
        self.page = context.pages[0] if context.pages else context.new_page()
        self.console: list[str] = []
        self._opened = 0
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def write_notebook(self, name: str, cells: list[str]) -> Path:
        """Write a notebook of code cells into the server's folder."""
        return self.server.write_notebook(name, cells)

    def open_notebook(self, name: str, timeout: float = 60.0) -> None:
        """Open ``name`` in JupyterLab and wait until its kernel is idle."""
        # a workspace of its own: only this notebook is open, so "the current notebook" (what
        # Run All acts on) cannot be one opened before
        self._opened += 1
        self.page.goto(f"{self.server.url}lab/workspaces/wb-{self._opened}/tree/{name}"
                       f"?token={self.server.token}")
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell",
                                    timeout=timeout * 1000)
        dialog = self.page.locator(".jp-Dialog .jp-mod-accept", has_text="Select")
        with contextlib.suppress(Exception):  # only when JupyterLab asks which kernel
            dialog.click(timeout=2000)
        self.page.wait_for_function(
            """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) '
                 + '.jp-Notebook-ExecutionIndicator')].some(e => e.dataset.status === 'idle')
                 && !document.querySelector('.jp-Dialog')""", timeout=timeout * 1000)

    def wait_kernel_idle(self, timeout: float = 60.0) -> None:
        """Wait until the open notebook's kernel reports idle."""
        self.page.wait_for_selector(
            ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator"
            "[data-status='idle']", state="attached", timeout=timeout * 1000)

    def run_all(self, attempts: int = 2) -> None:
        """Run every cell through the menu: Run → Run All Cells; checks that it started."""
        panel = ".jp-NotebookPanel:not(.lm-mod-hidden)"
        for attempt in range(attempts):
            # focus the notebook first: the menu acts on the notebook that has focus
            self.page.locator(f"{panel} .jp-Cell .jp-InputPrompt").first.click()
            self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            self.page.locator(".lm-Menu-itemLabel",
                              has_text=re.compile(r"^Run All Cells$")).click()
            try:
                self.page.wait_for_function(
                    rf"""() => [...document.querySelectorAll(
                          '{panel} .jp-CodeCell .jp-InputArea-prompt')]
                          .some(p => /\[(\*|\d+)\]/.test(p.textContent))""",
                    timeout=15_000, polling=100)
                return
            except Exception:
                if attempt == attempts - 1:
                    self.screenshot("run-all-did-not-start")
                    raise
                self.page.keyboard.press("Escape")

    def wait_cells_done(self, timeout: float = 120.0) -> None:
        """Wait until every code cell has an execution count (none is queued or running)."""
        self.page.wait_for_function(
            """() => {
                 const prompts = [...document.querySelectorAll(
                   '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')];
                 return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
               }""", timeout=timeout * 1000, polling=250)
        self.wait_kernel_idle(timeout)

    def cell_errors(self) -> list[str]:
        """The text of every error output (tracebacks) in the open notebook."""
        return self.page.eval_on_selector_all(
            ".jp-NotebookPanel:not(.lm-mod-hidden) "
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
            "els => els.map(e => e.textContent)")

    def run_notebook(self, name: str, cells: list[str], timeout: float = 120.0) -> None:
        """Write, open and run a notebook; fail with the cell's traceback if one raised."""
        self.write_notebook(name, cells)
        self.open_notebook(name)
        self.run_all()
        try:
            self.wait_cells_done(timeout)
        except Exception:
            self.screenshot(f"{Path(name).stem}-timeout")
            raise
        errors = [e for e in self.cell_errors() if "Traceback" in e]
        if errors:
            self.screenshot(f"{Path(name).stem}-error")
            pytest.fail(f"{name}: a cell raised:\n" + "\n---\n".join(errors), pytrace=False)

    def wait_for(self, selector: str, timeout: float = 30.0, state: str = "visible") -> Any:
        """Wait for a selector in the page; returns its ElementHandle."""
        return self.page.wait_for_selector(selector, timeout=timeout * 1000, state=state)

    def screenshot(self, name: str, selector: str | None = None) -> Path:
        """Save a PNG of the page (or one element) under test-artifacts/; returns its path."""
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = self.artifacts / f"{name}.png"
        target = self.page.locator(selector).first if selector else self.page
        target.screenshot(path=str(path))
        return path

    def close_notebook(self) -> None:
        """Shut down the kernels of this server (frees memory between tests)."""
        for kernel in self.server.api("api/kernels") or []:
            with contextlib.suppress(OSError, urllib.error.URLError):
                self.server.api(f"api/kernels/{kernel['id']}", method="DELETE")


@contextlib.contextmanager
def launched_browser(profile: Path) -> Iterator[Any]:
    """Headless Debian Chromium with a fresh profile: a Playwright BrowserContext."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(30_000)
        try:
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def lab_session(base: Path) -> Iterator[Lab]:
    """A server and a browser outside pytest (bench/ui.py): yields the page helper."""
    server = start_lab_server(base / "lab")
    try:
        with launched_browser(base / "chromium-profile") as context:
            yield Lab(server, context)
    finally:
        stop_lab_server(server)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium (fresh profile) per test module: a Playwright BrowserContext."""
    with launched_browser(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


@pytest.fixture(scope="module")
def lab(lab_server: LabServer, browser: Any) -> Lab:
    """The page helper on this module's server and browser."""
    return Lab(lab_server, browser)


def new_tempdir(prefix: str = "wb-browser-") -> Path:
    """A fresh temp folder (for callers outside pytest, such as bench/ui.py)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


# Notebook source that writes chain.onnx: a 2,000-node graph (Relu chain, an Add every third
# node reaching back three), for the graph view's render budget (test and bench/ui.py).
CHAIN_2000 = """\
import onnx
from onnx import TensorProto, helper
nodes, prev = [], "x"
for i in range(2000):
    ins = [prev, f"t{i - 3}"] if i % 3 == 2 and i >= 3 else [prev]
    nodes.append(helper.make_node("Add" if len(ins) == 2 else "Relu", ins, [f"t{i}"], name=f"n{i}"))
    prev = f"t{i}"
vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", prev)]
onnx.save(helper.make_model(helper.make_graph(nodes, "chain", vi[:1], vi[1:])), "chain.onnx")
"""

# Notebook source that writes modules.onnx: a 3,000-node graph named as the TorchScript exporter
# names nodes (/stage3/stage3.7/op12/Relu): 10 stages of 10 blocks of 30 ops, a residual Add every
# third op; for the graph view's module grouping (bench/ui.py, tests/test_browser_graph.py).
MODULES_3000 = """\
import onnx
from onnx import TensorProto, helper
nodes, prev = [], "x"
for s in range(10):
    for b in range(10):
        for k in range(30):
            i = len(nodes)
            op = "Add" if k % 3 == 2 else "Relu"
            ins = [prev, prev if k < 3 else f"t{i - 3}"] if op == "Add" else [prev]
            nodes.append(helper.make_node(op, ins, [f"t{i}"], name=f"/stage{s}/stage{s}.{b}/op{k}/{op}"))
            prev = f"t{i}"
vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", prev)]
onnx.save(helper.make_model(helper.make_graph(nodes, "modules", vi[:1], vi[1:])), "modules.onnx")
"""
