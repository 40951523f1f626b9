"""Crash isolation: native backends run in a worker; a real segfault leaves the caller alive."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.runtime import NcnnRunner, OrtRunner


@pytest.fixture(scope="module")
def sr(tmp_path_factory):
    model, x = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("worker") / "ws")
    return model, x, wb.export(model, x, workspace=ws), wb.to_ncnn(model, x, workspace=ws)


def test_runners_are_isolated_by_default_and_agree_with_in_process(sr, fresh_worker):
    _, (x,), onx, nc = sr
    for remote, local in [(OrtRunner(onx), OrtRunner(onx, isolated=False)),
                          (NcnnRunner(nc), NcnnRunner(nc, isolated=False))]:
        assert remote.isolated and not local.isolated
        a, b = remote.run((x,)), local.run((x,))
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert fresh_worker.alive and fresh_worker.pid != os.getpid()
    assert remote._session is None if hasattr(remote, "_session") else remote._net is None


def test_capture_all_through_the_worker(sr, fresh_worker):
    _, (x,), onx, nc = sr
    ort_all = OrtRunner(onx).run((x,), capture="all")
    assert "output" in ort_all and len(ort_all) > 5
    assert ort_all["output"].shape == (1, 3, 192, 192)
    nc_all = NcnnRunner(nc).run((x,), capture="all")
    assert nc_all["2"].shape == (64, 192, 192)


def test_a_segfault_in_ncnn_raises_backend_crashed_and_the_caller_lives(sr, fresh_worker,
                                                                        tmp_path):
    _, (x,), _, nc = sr
    # a 1-D array fed to this conv net makes ncnn read past its buffer and segfault (seen
    # every time here). run() refuses it (issue 37: a Convolution reads (c, h, w)), so it is
    # handed to the runner's twin in the worker as a feed that passed the checks would be
    bare = tmp_path / "m.ncnn.param"
    shutil.copy(nc.path, bare)
    shutil.copy(nc.dir / "model.ncnn.bin", tmp_path / "m.ncnn.bin")
    crashing = NcnnRunner(bare)
    with pytest.raises(wb.BackendCrashed) as info:
        crashing._remote.execute({"in0": np.random.rand(100_000).astype(np.float32)},
                                 "outputs")
    e = info.value
    assert e.signal == "SIGSEGV" and e.backend == "ncnn (fp32)"
    assert "this process is unharmed" in e.message and e.hint
    assert not fresh_worker.alive
    # the next run starts a fresh worker; the same runner works again with a good input
    # (no _ncnn.py, so no batch axis either: feed ncnn's own CHW layout)
    generation = fresh_worker.generation
    out = crashing.run((x[0].numpy(),))
    assert fresh_worker.generation == generation + 1
    with torch.no_grad():
        np.testing.assert_allclose(out["out0"], sr[0](x)[0].numpy(), atol=1e-4)


def test_errors_in_the_worker_come_back_as_errors_not_crashes(sr, fresh_worker, tmp_path):
    _, (x,), _, nc = sr
    # a layer type ncnn has no implementation of: only ncnn's load_param in the worker finds
    # it (a truncated .bin is refused before the worker, tests/test_ncnn_files.py)
    (tmp_path / "t.ncnn.param").write_text(nc.path.read_text().replace("Interp ", "FrobLayer ",
                                                                        1))
    (tmp_path / "t.ncnn.bin").write_bytes((nc.dir / "model.ncnn.bin").read_bytes())
    runner = NcnnRunner(tmp_path / "t.ncnn.param")
    with pytest.raises(wb.MissingOpError, match="ncnn has no layer type for FrobLayer"):
        runner.run((x,))
    assert fresh_worker.alive  # an error, not a crash


def test_bad_inputs_are_refused_before_the_worker_sees_them(sr, fresh_worker):
    _, _, onx, _ = sr
    r = OrtRunner(onx)
    with pytest.raises(wb.InputError, match="expected float32, got float64"):
        r.run((np.zeros((1, 3, 64, 64)),))
    with pytest.raises(wb.InputError, match=r"expected shape \[1, 3, 64, 64\], got \[1, 3, 8\]"):
        r.run((np.zeros((1, 3, 8), np.float32),))
    with pytest.raises(wb.InputError, match="takes 1 input"):
        r.run(())
    assert fresh_worker.alive


def test_ort_runner_on_a_bad_file_is_a_clear_error(tmp_path):
    f = tmp_path / "x.onnx"
    f.write_text("not onnx")
    with pytest.raises(wb.ModelFileError, match="is not an ONNX model"):
        OrtRunner(f)


def _contrib_inverse(tmp_path):
    import onnx
    from onnx import helper

    g = helper.make_graph(
        [helper.make_node("Inverse", ["x"], ["y"], domain="ai.onnx.contrib")], "g",
        [helper.make_tensor_value_info("x", 1, [3, 3])],
        [helper.make_tensor_value_info("y", 1, [3, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.contrib", 1)])
    m.ir_version = 8
    path = tmp_path / "inverse.onnx"
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("isolated", [True, False])
def test_onnxruntime_extensions_ops_run_with_their_library(tmp_path, fresh_worker, isolated):
    a = np.random.default_rng(0).random((3, 3), dtype=np.float32) + 3 * np.eye(3, dtype=np.float32)
    y = OrtRunner(_contrib_inverse(tmp_path), isolated=isolated).run((a,))["y"]
    np.testing.assert_allclose(y @ a, np.eye(3), atol=1e-5)


def test_custom_domain_without_implementation_names_op_domain_and_fix(tmp_path, fresh_worker):
    import onnx

    m = onnx.load(_contrib_inverse(tmp_path))
    m.graph.node[0].domain = "mylib"
    m.opset_import[1].domain = "mylib"
    onnx.save(m, tmp_path / "mylib.onnx")
    with pytest.raises(wb.MissingOpError) as info:
        OrtRunner(tmp_path / "mylib.onnx").run((np.eye(3, dtype=np.float32),))
    assert "mylib::Inverse (domain 'mylib', opset 1)" in info.value.message
    assert "libraries=" in info.value.hint
    assert fresh_worker.alive  # an error, carried back, not a crash
    with pytest.raises(wb.ModelFileError, match="custom-op library '/nope.so' does not exist"):
        OrtRunner(tmp_path / "mylib.onnx", isolated=False, libraries=["/nope.so"]).run(
            (np.eye(3, dtype=np.float32),))


def test_ncnn_layer_without_registration_names_it(sr, tmp_path):
    _, (x,), _, nc = sr
    text = nc.path.read_text().replace("Interp ", "MyUpsample ", 1)
    (tmp_path / "u.ncnn.param").write_text(text)
    (tmp_path / "u.ncnn.bin").write_bytes((nc.dir / "model.ncnn.bin").read_bytes())
    with pytest.raises(wb.MissingOpError, match=r"no layer type for MyUpsample \(upsample_0\)"):
        NcnnRunner(tmp_path / "u.ncnn.param", isolated=False).run((x,))


def test_a_dropped_runner_frees_its_twin_in_the_worker(sr, fresh_worker):
    import gc

    _, (x,), onx, nc = sr
    for _ in range(3):  # a notebook re-running a comparison cell
        OrtRunner(onx).run((x,))
        NcnnRunner(nc).run((x,))
        gc.collect()
    keep = OrtRunner(onx)
    keep.run((x,))
    assert fresh_worker.call({"op": "ping"}, "test")["runners"] == 1


def test_a_twin_dropped_in_the_worker_is_built_again(sr, fresh_worker):
    _, (x,), onx, _ = sr
    r = OrtRunner(onx)
    first = r.run((x,))["output"]
    fresh_worker.call({"op": "drop", "key": r._remote.key}, "test")
    np.testing.assert_array_equal(r.run((x,))["output"], first)


ARRAYS = {"f32": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
          "fortran": np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
          "empty": np.zeros((0, 5), dtype=np.float16), "scalar": np.array(3.5),
          "bool": np.array([True, False]), "strided": np.arange(10.0)[::3]}


def test_arrays_travel_packed_in_one_file_and_come_back_as_mapped_views(tmp_path):
    from workbench.runtime.transfer import pack, unpack

    path = str(tmp_path / "arena")
    index = pack(path, {**ARRAYS, "again": ARRAYS["f32"]})
    assert index["arrays"]["again"] == index["arrays"]["f32"]  # one array, written once
    got = unpack(path, index)
    for name, arr in ARRAYS.items():
        assert type(got[name]) is np.ndarray and got[name].dtype == arr.dtype, name
        np.testing.assert_array_equal(got[name], arr, err_msg=name)
    os.unlink(path)  # the pages stay with the arrays that map them
    np.testing.assert_array_equal(got["f32"], ARRAYS["f32"])
    got["f32"][...] = 0  # writable (the file is written over only once they are gone)
    with pytest.raises(TypeError, match="'o' holds Python objects"):
        pack(path, {"o": np.array([None])})


def test_a_shared_file_is_in_use_while_any_view_of_it_lives(tmp_path):
    import torch

    from workbench.runtime.transfer import Packer, SharedFile, unpack

    f = SharedFile(str(tmp_path / "f"))
    assert not f.in_use()
    index = Packer(f).index({"a": np.arange(6.0).reshape(2, 3)})
    assert not f.in_use()  # the packer let go of what it wrote
    got = unpack(f, index)
    assert f.in_use()
    row = got["a"][1]
    t = torch.from_numpy(row)
    del got
    assert f.in_use()  # a view of a view, held by a tensor
    del row
    assert f.in_use()
    del t
    assert not f.in_use()


def test_a_packer_grows_its_file_and_keeps_what_it_wrote(tmp_path):
    from workbench.runtime.transfer import Packer, SharedFile, unpack

    f = SharedFile(str(tmp_path / "g"))
    packer = Packer(f, size_hint=128)  # far too small: the file grows while it writes
    arrays = {}
    for k in range(20):
        arrays[f"x{k}"] = a = packer.alloc((k + 1, 1000), np.float32)
        a[...] = k
    arrays["copied"] = np.full(3, 7, np.int64)  # made elsewhere: copied in
    index = packer.index(arrays)
    del arrays, a, packer
    assert index["size"] <= os.path.getsize(f.path)
    got = unpack(SharedFile(f.path), index)  # as the other process maps it
    for k in range(20):
        assert got[f"x{k}"].shape == (k + 1, 1000) and (got[f"x{k}"] == k).all()
    assert got["copied"].tolist() == [7, 7, 7]


def test_result_files_are_written_over_only_once_the_caller_let_go(sr):
    _, (x,), onx, _ = sr
    r = OrtRunner(onx)
    arenas = r._remote._arenas
    first = r.run((x,), capture="all")
    first_file = arenas.files[-1].path
    kept = {k: v.copy() for k, v in first.items()}
    second = r.run((x * 2,), capture="all")  # `first` is held: a new file, the old let go
    assert [f.path for f in arenas.files] != [first_file] and not os.path.exists(first_file)
    for k in kept:  # unlinked, still mapped by its arrays, not written over
        np.testing.assert_array_equal(first[k], kept[k])
    files = [f.path for f in arenas.files]
    del first, second
    for _ in range(3):  # nothing held between runs: the kept file serves every run
        r.run((x,), capture="all")
    assert [f.path for f in arenas.files] == files
    again = r.run((x,), capture="all")
    for k in kept:
        np.testing.assert_allclose(again[k], kept[k], rtol=1e-6)


@pytest.mark.parametrize("isolated", [False, True])
def test_blobs_fed_to_ncnn_are_read_not_written(sr, isolated):
    from workbench.params import parse_ncnn_param

    _, (x,), _, nc = sr
    r = NcnnRunner(nc, isolated=isolated)
    full = r.run((x,), capture="all")
    layers = [ly for ly in parse_ncnn_param(nc.path).layers
              if ly.type not in ("Input", "Split", "MemoryData")]
    mid, last = layers[1], layers[-1]  # feed the second layer's input, read the end
    fed = {b: full[b].copy() for b in mid.bottoms}
    before = {b: v.copy() for b, v in fed.items()}
    got = r.run_blobs({**r.feed((x,)), **fed}, [last.tops[0], mid.bottoms[0]])
    want = full[last.tops[0]]  # capture="all" puts the batch axis back on outputs
    np.testing.assert_allclose(got[last.tops[0]].reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[mid.bottoms[0]], before[mid.bottoms[0]])  # a fed blob
    for b in fed:
        np.testing.assert_array_equal(fed[b], before[b])


def test_onnx_results_written_in_place_fall_back_when_shapes_follow_the_values(tmp_path,
                                                                              fresh_worker):
    import onnx
    from onnx import TensorProto, helper

    # NonZero: the output shape depends on the input values, so results bound to the
    # shapes of the run before do not fit
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["idx"])],
        "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "nz.onnx"
    onnx.save(model, path)
    r = OrtRunner(path)
    for capture in ("outputs", "all", "all", "outputs"):
        for x in ([1, -1, 0, 2], [3, 1, -2, 5], [0, 0, 0, 1]):
            got = r.run((np.array(x, np.float32),), capture=capture)
            want = np.nonzero(np.maximum(x, 0))[0][None]
            np.testing.assert_array_equal(got["idx"], want)
            if capture == "all":
                np.testing.assert_array_equal(got["r"], np.maximum(x, 0))


def test_onnx_results_written_in_place_equal_a_plain_run(sr):
    _, (x,), onx, _ = sr
    here = OrtRunner(onx, isolated=False).run((x,), capture="all")
    r = OrtRunner(onx)
    for _ in range(3):  # the first run learns the shapes, the next ones bind them
        got = r.run((x,), capture="all")
        assert got.keys() == here.keys()
        for k in here:
            np.testing.assert_array_equal(got[k], here[k], err_msg=k)
    assert r._remote._arenas.sizes["all"] >= sum(v.nbytes for v in here.values())


def test_calls_from_several_threads_get_their_own_replies(sr, fresh_worker):
    from concurrent.futures import ThreadPoolExecutor

    _, (x,), onx, nc = sr
    runners = [OrtRunner(onx), NcnnRunner(nc), OrtRunner(onx), NcnnRunner(nc)]
    local = {"ort": OrtRunner(onx, isolated=False), "ncnn": NcnnRunner(nc, isolated=False)}
    inputs = [x * (k + 1) for k in range(6)]

    def job(k: int) -> None:
        r = runners[k % 4]
        here = local["ort" if isinstance(r, OrtRunner) else "ncnn"]
        for xi in inputs:
            got, want = r.run((xi,)), here.run((xi,))
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(job, k) for k in range(8)]:
            f.result()
    assert fresh_worker.alive


def test_a_crash_fails_every_call_waiting_on_the_worker(sr, fresh_worker, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    _, (x,), _, nc = sr
    bare = []
    for k in range(2):  # two runners, two handles: both requests can be in flight at once
        p = tmp_path / f"m{k}.ncnn.param"
        shutil.copy(nc.path, p)
        shutil.copy(nc.dir / "model.ncnn.bin", tmp_path / f"m{k}.ncnn.bin")
        bare.append(NcnnRunner(p))
    crash = {"in0": np.random.rand(100_000).astype(np.float32)}  # segfaults ncnn (see above)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(r._remote.execute, crash, "outputs") for r in bare]
        for f in futures:
            with pytest.raises(wb.BackendCrashed):
                f.result(timeout=120)
    assert bare[0].run((x[0].numpy(),))["out0"].shape[-1] == 192  # a fresh worker serves


def test_kept_result_files_stay_mapped_and_show_each_runs_values(sr):
    _, (x,), onx, _ = sr
    r = OrtRunner(onx)
    r._remote.keep_mapped = True  # as compare's own runners in accumulated mode
    arenas = r._remote._arenas
    first = r.run((x,), capture="all")
    want1 = {k: v.copy() for k, v in first.items()}
    kept = arenas.files[-1]
    assert kept.in_use()
    second = r.run((x * 2,), capture="all")  # `first` is held: another file
    want2 = {k: v.copy() for k, v in second.items()}
    assert arenas.files[-1] is not kept
    for k in want1:
        np.testing.assert_array_equal(first[k], want1[k])
    del first, second
    f = arenas.files[-1]
    assert not f.in_use() and f._kept is not None  # let go, still mapped
    for xi, want in ((x, want1), (x * 2, want2), (x, want1)):
        got = r.run((xi,), capture="all")  # the same file and mapping, new values each run
        assert arenas.files[-1] is f and f.in_use()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, err_msg=k)
        del got


def test_the_workers_kept_output_files_take_runs_from_two_threads_at_once(tmp_path):
    # compare runs ORT's and ncnn's captures at once, on two threads of the worker: one
    # thread's scan of the kept files (a stat each, the GIL let go) met the other's insert,
    # 'dictionary changed size during iteration', a failed capture and a lost comparison
    import threading

    from workbench.runtime import worker_main as w

    before = dict(w._KEPT)
    errors: list[BaseException] = []
    paths = [str(tmp_path / f"out{i}") for i in range(1000)]
    for p in paths:
        open(p, "wb").close()

    def insert() -> None:
        try:
            for p in paths:
                w._output_file(p, keep=True)
        except BaseException as e:  # noqa: BLE001 - the failure under test
            errors.append(e)

    def scan() -> None:
        try:
            for _ in range(300):
                w._output_file(paths[0], keep=True)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    try:
        threads = [threading.Thread(target=insert), threading.Thread(target=scan)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert set(paths) <= set(w._KEPT)
    finally:
        w._KEPT.clear()
        w._KEPT.update(before)


def test_a_tainted_worker_is_replaced_once_no_call_waits_on_it(sr, fresh_worker):
    """Worker.taint (a run that may have damaged the heap): the next call with nothing else
    in flight starts a fresh process; a call still in flight finishes in the old one."""
    import threading

    _, (x,), onx, nc = sr
    ort, ncnn = OrtRunner(onx), NcnnRunner(nc)
    want = ncnn.run((x,))["out0"]
    first = fresh_worker.pid
    fresh_worker.taint()
    assert fresh_worker.pid == first  # nothing killed yet
    np.testing.assert_array_equal(ncnn.run((x,))["out0"], want)  # its twin is made again
    second = fresh_worker.pid
    assert second != first
    # in flight: a call on another thread keeps the tainted process until it is answered
    started, release = threading.Event(), threading.Event()
    real_wait = fresh_worker._wait

    def slow_wait(*args, **kw):
        started.set()
        release.wait(30)
        return real_wait(*args, **kw)

    fresh_worker._wait = slow_wait
    t = threading.Thread(target=ort.run, args=((x,),))
    t.start()
    assert started.wait(30)
    fresh_worker._wait = real_wait
    fresh_worker.taint()
    np.testing.assert_array_equal(ncnn.run((x,))["out0"], want)  # runs in the same process
    assert fresh_worker.pid == second
    release.set()
    t.join(30)
    ncnn.run((x,))
    assert fresh_worker.pid not in (first, second)


def test_warm_starts_the_worker_with_its_modules_and_never_raises(fresh_worker):
    """worker.warm starts the worker in the background with the modules imported there
    (onnxruntime's library mapped in that process before any call of ours); a module that
    cannot be imported raises nothing here, and the worker serves on."""
    import time

    from workbench.errors import RemoteError
    from workbench.runtime import worker as worker_mod

    assert not fresh_worker.alive
    worker_mod.warm(("no_such_module_wbtest",))  # fails in the worker: nothing raised here
    worker_mod.warm(("onnxruntime",))

    def mapped() -> bool:
        try:
            with open(f"/proc/{fresh_worker.pid}/maps") as f:
                return "onnxruntime_pybind11_state" in f.read()
        except (OSError, TypeError):
            return False

    end = time.monotonic() + 60
    while not mapped() and time.monotonic() < end:
        time.sleep(0.05)
    assert fresh_worker.alive and mapped()
    pid = fresh_worker.pid
    with pytest.raises(RemoteError, match="no_such_module_wbtest"):
        fresh_worker.call({"op": "warm", "modules": ["no_such_module_wbtest"]}, "test")
    assert fresh_worker.call({"op": "ping"}, "test")["pid"] == pid  # the same one, alive
