"""Inline Netron through a real Jupyter server: base URL, token, only the registered files.

One ``jupyter server`` per module, on loopback with base_url ``/wb/`` and a token, started
without any extension flag: the extension must be enabled by the environment's own config
(what the package installs). The test process plays the kernel: it shares the server's
runtime folder, where ``wb.ui.netron`` registers the files the server may serve.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import workbench as wb

BASE = "/wb/"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("jupyter")
    runtime = root / "runtime"
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime),
               JUPYTER_CONFIG_DIR=str(root / "config"), JUPYTER_DATA_DIR=str(root / "data"))
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--ServerApp.base_url={BASE}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}{BASE}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2):
                break
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.close()
                pytest.fail("jupyter server did not start:\n"
                            + (root / "server.log").read_text()[-3000:])
            time.sleep(0.2)
    old = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(runtime)  # the "kernel" registers here
    yield {"url": url, "token": token, "log": root / "server.log"}
    if old is None:
        os.environ.pop("JUPYTER_RUNTIME_DIR", None)
    else:
        os.environ["JUPYTER_RUNTIME_DIR"] = old
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _get(server: dict, path: str, token: bool = True) -> tuple[int, bytes, Any]:
    sep = "&" if "?" in path else "?"
    url = server["url"] + path + (f"{sep}token={server['token']}" if token else "")
    req = urllib.request.Request(url)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


@pytest.fixture(scope="module")
def onnx_art(tmp_path_factory: pytest.TempPathFactory):
    model, inputs = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("ws"))
    return wb.export(model, inputs, workspace=ws)


def test_the_environment_enables_the_server_extension() -> None:
    from jupyter_core.paths import jupyter_config_path
    from jupyter_server.extension.config import ExtensionConfigManager

    enabled = ExtensionConfigManager(read_config_path=jupyter_config_path()).enabled(
        "workbench.ui.netron_server")
    assert enabled, ("workbench.ui.netron_server is not enabled in this environment: "
                     "reinstall the package (pip install -e '.[lab,dev]' installs "
                     "jupyter-config/ into <venv>/etc/jupyter) or run "
                     "`python -m workbench.ui.netron_server enable`")


def test_an_editable_install_ships_the_extension_config(tmp_path: Path) -> None:
    """``pip install -e .`` installs what enables the extension (setuptools alone skips it)."""
    import zipfile

    root = Path(__file__).resolve().parents[1]
    probe = ("import sys\nfrom setuptools import build_meta\n"
             "print(build_meta.build_editable(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    wheel = tmp_path / out.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    config = [n for n in names if n.endswith(
        ".data/data/etc/jupyter/jupyter_server_config.d/workbench.json")]
    assert config, names
    shipped = root / "jupyter-config" / "jupyter_server_config.d" / "workbench.json"
    assert zipfile.ZipFile(wheel).read(config[0]) == shipped.read_bytes()


def test_enable_writes_the_config_a_wheel_install_would(tmp_path: Path, monkeypatch) -> None:
    from jupyter_server.extension.config import ExtensionConfigManager

    from workbench.ui.netron_server import enable

    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    target = enable(user=True)
    assert target.parent == tmp_path / "jupyter_server_config.d"
    shipped = Path(__file__).resolve().parents[1] / "jupyter-config" / \
        "jupyter_server_config.d" / "workbench.json"
    assert json.loads(target.read_text()) == json.loads(shipped.read_text())
    assert ExtensionConfigManager(read_config_path=[str(tmp_path)]).enabled(
        "workbench.ui.netron_server")


def test_page_and_model_are_served_through_the_jupyter_server(server, onnx_art) -> None:
    view = wb.ui.netron(onnx_art)
    assert view.main == "model.onnx" and set(view.files) == {"model.onnx"}
    assert view.src(BASE) == f"{BASE}workbench/netron/{view.key}/"
    html = view._repr_html_()
    assert "localhost" not in html and "127.0.0.1" not in html
    assert f'data-wb-netron="workbench/netron/{view.key}/"' in html

    status, page, headers = _get(server, view.path)
    assert status == 200, page[:300]
    assert b'<meta name="file" content="data/model.onnx">' in page
    assert b'content="0.0.0"' in page  # telemetry off
    assert any(c.startswith("consent=") for c in headers.get_all("Set-Cookie"))
    status, js, headers = _get(server, view.path + "index.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and js
    status, body, _ = _get(server, view.path + "data/model.onnx")
    assert status == 200
    assert body == onnx_art.path.read_bytes()


def test_only_the_registered_files_are_served(server, onnx_art) -> None:
    view = wb.ui.netron(onnx_art)
    sidecar = onnx_art.dir / "artifact.json"
    assert sidecar.exists()
    assert _get(server, view.path + "data/artifact.json")[0] == 403
    assert _get(server, view.path + "data/..%2Fartifact.json")[0] in (403, 404)
    assert _get(server, view.path + "data/%2Fetc%2Fpasswd")[0] in (403, 404)
    assert _get(server, view.path + "..%2F..%2Fapi%2Fstatus")[0] == 404
    assert _get(server, view.path + "server.py")[0] == 404  # netron's Python is not an asset
    unknown = "A" * 24
    assert _get(server, f"workbench/netron/{unknown}/data/model.onnx")[0] == 404
    # no token, no cookie: the server's own authentication applies
    status, _, _ = _get(server, view.path + "data/model.onnx", token=False)
    assert status in (302, 403)


def test_ncnn_param_is_served_with_its_bin_only(server, tmp_path: Path) -> None:
    param = tmp_path / "tiny.ncnn.param"
    param.write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu0 1 1 in0 out0\n")
    (tmp_path / "tiny.ncnn.bin").write_bytes(b"\x00" * 16)
    (tmp_path / "secret.txt").write_text("not for the browser")
    view = wb.ui.netron(param)
    assert set(view.files) == {"tiny.ncnn.param", "tiny.ncnn.bin"}
    status, page, _ = _get(server, view.path)
    assert status == 200 and b'content="data/tiny.ncnn.param"' in page
    assert _get(server, view.path + "data/tiny.ncnn.param")[1] == param.read_bytes()
    assert _get(server, view.path + "data/tiny.ncnn.bin")[1] == b"\x00" * 16
    assert _get(server, view.path + "data/secret.txt")[0] == 403
    entry = json.loads((Path(os.environ["JUPYTER_RUNTIME_DIR"]) / "workbench-netron"
                        / f"{view.key}.json").read_text())
    assert sorted(entry["files"]) == ["tiny.ncnn.bin", "tiny.ncnn.param"]


def test_bad_inputs_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(wb.ModelFileError, match="does not exist") as e:
        wb.ui.netron(tmp_path / "missing.onnx")
    assert e.value.hint
    with pytest.raises(wb.InputError, match="Artifact or a model path"):
        wb.ui.netron(42)
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hello")
    with pytest.raises(wb.WorkbenchError):
        wb.ui.netron(not_a_model)


def test_an_unwritable_runtime_folder_is_a_clear_error(onnx_art, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "runtime-is-a-file"
    runtime.write_text("")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    with pytest.raises(wb.WorkbenchError, match="cannot register the model") as e:
        wb.ui.netron(onnx_art)
    assert "JUPYTER_RUNTIME_DIR" in e.value.hint


def test_a_hostile_file_name_stays_text_and_the_page_sends_a_csp(server, onnx_art,
                                                                  tmp_path: Path) -> None:
    from urllib.parse import quote

    name = 'evil"><img src=x onerror=alert(1)><script>alert(2)<\\script>.onnx'
    hostile = tmp_path / name
    hostile.write_bytes(onnx_art.path.read_bytes())
    view = wb.ui.netron(hostile)
    status, page, headers = _get(server, view.path)
    assert status == 200
    assert b"<img src=x" not in page and b"<script>alert(2)" not in page
    assert b'content="evil&quot;&gt;&lt;img src=x onerror=alert(1)&gt;' in page
    assert f'content="data/{quote(name, safe="")}"'.encode() in page
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "object-src 'none'" in csp
    assert "'unsafe-eval'" not in csp and "'unsafe-inline'" not in csp.split("style-src")[0]
    assert headers["X-Content-Type-Options"] == "nosniff"
    # the quoted address Netron fetches is the registered file, and nothing else
    status, body, headers = _get(server, view.path + "data/" + quote(name, safe=""))
    assert status == 200 and body == onnx_art.path.read_bytes()
    assert headers["Content-Disposition"] == "attachment"
    widget_html = view._repr_html_()
    assert "<img src=x" not in widget_html and "<script>alert(2)" not in widget_html
