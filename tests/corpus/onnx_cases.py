"""Damaged ONNX files: truncated, bit-flipped, and graphs mutated into invalid ones.

Each goes through an entry point (OrtRunner on the path, Workspace.import_file, simplify,
raise_ops, to_ncnn). Right is a hinted refusal, or, where the damage left a model that means
something, exactly what that model computes (see ``actions.onnx_truth``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .actions import Action, Context, onnx_truth, run_onnx_entry
from .harness import Case

ENTRIES = ("ort", "import", "simplify", "raise")


def _trunc(ctx: Context) -> Action:
    which, frac = ctx.p["model"], ctx.p["frac"]
    data = ctx.model(f"{which}.onnx").read_bytes()
    cut = int(len(data) * frac) if isinstance(frac, float) else (
        frac if frac >= 0 else len(data) + frac)
    path = ctx.inp / f"{which}.onnx"
    path.write_bytes(data[:cut])
    return lambda: run_onnx_entry(ctx.p["entry"], path, which, ctx, onnx_truth(path, which, ctx))


def _flip(ctx: Context) -> Action:
    which = ctx.p["model"]
    data = bytearray(ctx.model(f"{which}.onnx").read_bytes())
    for frac, bit in ctx.p["flips"]:
        data[int(len(data) * frac) % len(data)] ^= 1 << bit
    path = ctx.inp / f"{which}.onnx"
    path.write_bytes(bytes(data))
    return lambda: run_onnx_entry(ctx.p["entry"], path, which, ctx, onnx_truth(path, which, ctx))


# -- graph mutations (on the hand-made MLP: x -> MatMul W -> Add b -> Relu -> y) -------------
def _node(m: Any, name: str) -> Any:
    return next(n for n in m.graph.node if n.name == name)


def _init(m: Any, name: str) -> Any:
    return next(i for i in m.graph.initializer if i.name == name)


def m_cycle(m: Any) -> None:
    _node(m, "add").input[0] = "y"


def m_dangling(m: Any) -> None:
    _node(m, "add").input[1] = "nowhere"


def m_unknown_op(m: Any) -> None:
    _node(m, "relu").op_type = "Rellu"


def m_unknown_domain(m: Any) -> None:
    _node(m, "relu").domain = "com.corpus.nope"


def m_opset_future(m: Any) -> None:
    m.opset_import[0].version = 99


def m_opset_zero(m: Any) -> None:
    m.opset_import[0].version = 0


def m_no_opset(m: Any) -> None:
    del m.opset_import[:]


def m_ir_future(m: Any) -> None:
    m.ir_version = 99


def m_ir_zero(m: Any) -> None:
    m.ir_version = 0


def m_dup_output(m: Any) -> None:
    _node(m, "add").output[0] = "mm"


def m_missing_init(m: Any) -> None:
    m.graph.initializer.remove(_init(m, "W"))


def m_wrong_init_shape(m: Any) -> None:
    from onnx import numpy_helper

    w = _init(m, "W")
    w.CopyFrom(numpy_helper.from_array(np.ones((8, 5), np.float32), "W"))
    _init(m, "b").CopyFrom(numpy_helper.from_array(np.ones((5,), np.float32), "b"))


def m_init_float64(m: Any) -> None:
    from onnx import numpy_helper

    w = _init(m, "W")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w).astype(np.float64), "W"))


def m_input_int64(m: Any) -> None:
    m.graph.input[0].type.tensor_type.elem_type = 7


def m_output_bool(m: Any) -> None:
    m.graph.output[0].type.tensor_type.elem_type = 9


def m_bad_attr(m: Any) -> None:
    from onnx import helper

    _node(m, "relu").attribute.append(helper.make_attribute("alpha", 0.5))


def m_empty_graph(m: Any) -> None:
    del m.graph.node[:]


def m_no_outputs(m: Any) -> None:
    del m.graph.output[:]


def m_no_inputs(m: Any) -> None:
    del m.graph.input[:]


def m_huge_dim(m: Any) -> None:
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 10 ** 12


def m_negative_dim(m: Any) -> None:
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -5


def m_raw_short(m: Any) -> None:
    w = _init(m, "W")
    w.raw_data = w.raw_data[: len(w.raw_data) // 2]


def m_external_missing(m: Any) -> None:
    from onnx import TensorProto

    w = _init(m, "W")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    e = w.external_data.add()
    e.key, e.value = "location", "missing.data"


def m_string_init(m: Any) -> None:
    from onnx import helper

    _init(m, "W").CopyFrom(helper.make_tensor("W", 8, [8, 4], [b"a"] * 32))


def m_reshape_bad(m: Any) -> None:
    from onnx import helper, numpy_helper

    m.graph.initializer.append(numpy_helper.from_array(np.array([3, 3], np.int64), "shp"))
    _node(m, "add").input[0] = "mm_r"
    m.graph.node.insert(1, helper.make_node("Reshape", ["mm", "shp"], ["mm_r"], name="reshape"))


def m_gather_oob(m: Any) -> None:
    from onnx import helper, numpy_helper

    m.graph.initializer.append(numpy_helper.from_array(np.array([0, 7], np.int64), "idx"))
    _node(m, "relu").output[0] = "y_full"
    m.graph.node.append(helper.make_node("Gather", ["y_full", "idx"], ["y"], axis=0,
                                         name="gather"))


def m_reversed(m: Any) -> None:
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def m_dup_node_name(m: Any) -> None:
    _node(m, "add").name = "matmul"


def m_output_rank(m: Any) -> None:
    from onnx import TensorProto, helper

    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 1]))


def m_unused_input(m: Any) -> None:
    from onnx import TensorProto, helper

    m.graph.input.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1]))


def m_init_shadows_input(m: Any) -> None:
    from onnx import TensorProto, helper

    m.graph.input.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [4]))


def m_nan_weights(m: Any) -> None:
    from onnx import numpy_helper

    _init(m, "b").CopyFrom(numpy_helper.from_array(np.full((4,), np.nan, np.float32), "b"))


def m_local_function_loop(m: Any) -> None:
    from onnx import helper

    f = helper.make_function("corpus", "Loopy", ["a"], ["o"],
                             [helper.make_node("Loopy", ["a"], ["o"], domain="corpus")],
                             [helper.make_opsetid("", 17)])
    m.functions.append(f)
    m.opset_import.append(helper.make_opsetid("corpus", 1))
    n = _node(m, "relu")
    n.op_type, n.domain = "Loopy", "corpus"


def m_empty_names(m: Any) -> None:
    _node(m, "matmul").output[0] = ""
    _node(m, "add").input[0] = ""


# mutation -> "error" (must be refused) or "ok" (a valid model: its own output is right)
MUTATIONS: dict[str, tuple[Callable[[Any], None], str]] = {
    "cycle": (m_cycle, "error"), "dangling_input": (m_dangling, "error"),
    "unknown_op": (m_unknown_op, "error"), "unknown_domain": (m_unknown_domain, "error"),
    "opset_future": (m_opset_future, "error"), "opset_zero": (m_opset_zero, "error"),
    "no_opset": (m_no_opset, "error"), "ir_future": (m_ir_future, "either"),
    "ir_zero": (m_ir_zero, "error"), "dup_output": (m_dup_output, "error"),
    "missing_initializer": (m_missing_init, "error"),
    "wrong_init_shape": (m_wrong_init_shape, "error"),
    "init_float64": (m_init_float64, "error"), "input_int64": (m_input_int64, "error"),
    "output_declared_bool": (m_output_bool, "error"), "bad_attribute": (m_bad_attr, "error"),
    "empty_graph": (m_empty_graph, "error"), "no_outputs": (m_no_outputs, "error"),
    "no_inputs": (m_no_inputs, "error"), "huge_dim": (m_huge_dim, "error"),
    "negative_dim": (m_negative_dim, "error"), "raw_data_short": (m_raw_short, "error"),
    "external_missing": (m_external_missing, "error"), "string_init": (m_string_init, "error"),
    "reshape_bad_numel": (m_reshape_bad, "error"), "gather_out_of_range": (m_gather_oob, "error"),
    "nodes_reversed": (m_reversed, "either"), "dup_node_name": (m_dup_node_name, "either"),
    "output_rank_declared_3": (m_output_rank, "error"), "unused_input": (m_unused_input, "either"),
    "init_shadows_input": (m_init_shadows_input, "either"),
    "nan_bias": (m_nan_weights, "ok"), "recursive_function": (m_local_function_loop, "error"),
    "empty_value_names": (m_empty_names, "error"),
}


def _mutate(ctx: Context) -> Action:
    import onnx

    from .base import mlp_model

    m = mlp_model(ctx.index["seed"])
    fn, _ = MUTATIONS[ctx.p["mutation"]]
    fn(m)
    path = ctx.inp / "mlp.onnx"
    path.write_bytes(m.SerializeToString())
    truth = None
    if ctx.p["mutation"] == "nan_bias":
        x, y = ctx.ref("mlp")
        truth = np.full_like(y, np.nan)
    elif MUTATIONS[ctx.p["mutation"]][1] == "either" and ctx.p["mutation"] != "ir_future":
        truth = ctx.ref("mlp")[1]
    del onnx
    return lambda: run_onnx_entry(ctx.p["entry"], path, "mlp", ctx, truth)


KINDS = {"onnx_trunc": _trunc, "onnx_flip": _flip, "onnx_mutate": _mutate}


def cases(rng: np.random.Generator) -> list[Case]:
    out: list[Case] = []
    special: list[Any] = [0, 1, 16, -1, -4]
    for which in ("tiny", "mlp"):
        fracs: list[Any] = special + [round(float(f), 4) for f in rng.uniform(0.02, 0.98, 9)]
        for i, frac in enumerate(fracs):
            entry = ("ort", "import")[i % 2] if i >= 5 else "ort"
            out.append(Case(f"onnx_trunc-{which}-{i:02d}-{entry}", "onnx_trunc", "onnx_trunc",
                            {"model": which, "frac": frac, "entry": entry}))
        for i in range(4):
            frac = round(float(rng.uniform(0.1, 0.9)), 4)
            out.append(Case(f"onnx_trunc-{which}-s{i}-simplify", "onnx_trunc", "onnx_trunc",
                            {"model": which, "frac": frac, "entry": "simplify"}))
        for i in range(14):
            n = 1 if i < 10 else 8
            flips = [[round(float(rng.uniform(0, 1)), 5), int(rng.integers(0, 8))]
                     for _ in range(n)]
            out.append(Case(f"onnx_flip-{which}-{i:02d}", "onnx_flip", "onnx_flip",
                            {"model": which, "flips": flips, "entry": "ort"}, expect="either"))
    for name, (_, expect) in MUTATIONS.items():
        for entry in ENTRIES:
            out.append(Case(f"onnx_mutate-{name}-{entry}", "onnx_mutate", "onnx_mutate",
                            {"mutation": name, "entry": entry}, expect=expect))
    for name in ("cycle", "unknown_op", "empty_graph"):
        out.append(Case(f"onnx_mutate-{name}-to_ncnn", "onnx_mutate", "onnx_mutate",
                        {"mutation": name, "entry": "to_ncnn"}, timeout=120))
    return out

