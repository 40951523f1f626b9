"""recurrent_outputs: an LSTM/GRU/RNN node (one op for the whole layer) named for a module
returns that module's output records by position (Y, Y_h, Y_c: output, h_n, c_n), whatever
its values: a layer whose weights are damaged is measured where it is (issue 36), not
attributed as a step of its module or left unaligned."""

import numpy as np

from workbench.comparison.align import CandidateTensor, align, without

RNG = np.random.default_rng(36)


def _case(damage=0.0, batch=1, outputs=3):
    x = RNG.standard_normal((batch, 5, 4)).astype(np.float32)
    out = RNG.standard_normal((batch, 5, 4)).astype(np.float32)  # batch first
    h_n, c_n = RNG.standard_normal((2, 1, batch, 4)).astype(np.float32)
    head = RNG.standard_normal((batch, 5, 3)).astype(np.float32)
    reference = {"act": x, "lstm.0": out, "lstm.1": h_n, "lstm.2": c_n, "head": head}
    y = np.transpose(out, (1, 0, 2))[:, None]  # ONNX's Y: [seq, dirs, batch, hidden]
    names = ["/lstm/LSTM_output_0", "/lstm/LSTM_output_1", "/lstm/LSTM_output_2"][:outputs]
    values = [y, h_n, c_n][:outputs]
    candidate = {"/act/Transpose_output_0": np.transpose(x, (1, 0, 2)).copy(),
                 **{n: v + damage for n, v in zip(names, values, strict=True)},
                 "/lstm/Squeeze_output_0": y[:, 0] + damage, "/head/Add_output_0": head + damage}
    tensors = [CandidateTensor("/act/Transpose_output_0", 0, "Transpose", "act"),
               *(CandidateTensor(n, 1, "LSTM", "lstm", internal=k == 0, node="/lstm/LSTM",
                                 inputs=("/act/Transpose_output_0",))
                 for k, n in enumerate(names)),
               CandidateTensor("/lstm/Squeeze_output_0", 2, "Squeeze", "lstm",
                               inputs=(names[0],)),
               CandidateTensor("/head/Add_output_0", 3, "Add", "head",
                               inputs=("/lstm/Squeeze_output_0",))]
    return reference, candidate, tensors, {"act", "lstm", "head"}


def test_damaged_outputs_pair_with_the_modules_records_by_position():
    al = align(*_case(damage=3.0))
    assert al.pairs["/lstm/LSTM_output_0"] == "lstm.0"
    assert al.pairs["/lstm/LSTM_output_1"] == "lstm.1"
    assert al.pairs["/lstm/LSTM_output_2"] == "lstm.2"
    assert al.decided_by["/lstm/LSTM_output_1"] == "recurrent_outputs"
    assert "/lstm/LSTM_output_0" not in al.invariants  # structure is evidence


def test_without_the_rule_the_damaged_outputs_are_not_measured():
    al = align(*_case(damage=3.0), rules=without("recurrent_outputs"))
    assert "/lstm/LSTM_output_0" not in al.pairs  # a step of lstm: never measured
    assert "/lstm/LSTM_output_1" not in al.pairs  # h_n or c_n? the values cannot say


def test_clean_outputs_pair_the_same():
    al = align(*_case())
    assert [al.pairs[f"/lstm/LSTM_output_{k}"] for k in range(3)] == [
        "lstm.0", "lstm.1", "lstm.2"]


def test_batch_first_output_of_a_batch_is_measured_in_the_candidates_layout():
    reference, candidate, tensors, modules = _case(damage=3.0, batch=2)
    al = align(reference, candidate, tensors, modules)
    assert al.pairs["/lstm/LSTM_output_0"] == "lstm.0"
    got = al.as_candidate("/lstm/LSTM_output_0", reference["lstm.0"]).reshape(-1)
    want = (candidate["/lstm/LSTM_output_0"] - 3.0).reshape(-1)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_simplified_node_with_its_unread_states_dropped_keeps_y():
    al = align(*_case(damage=3.0, outputs=1))
    assert al.pairs["/lstm/LSTM_output_0"] == "lstm.0"


def test_an_inner_layer_of_a_stacked_module_is_not_its_output():
    reference, candidate, tensors, modules = _case(damage=3.0, outputs=1)
    # a second LSTM node of the same module reads the first one's output
    candidate["/lstm/LSTM_1_output_0"] = candidate["/lstm/LSTM_output_0"].copy()
    tensors.insert(3, CandidateTensor("/lstm/LSTM_1_output_0", 2, "LSTM", "lstm",
                                      node="/lstm/LSTM_1",
                                      inputs=("/lstm/Squeeze_output_0",)))
    tensors[-1].order = 4
    al = align(reference, candidate, tensors, modules)
    assert al.pairs.get("/lstm/LSTM_output_0") != "lstm.0"
    assert al.pairs["/lstm/LSTM_1_output_0"] == "lstm.0"


def test_an_exported_lstm_with_damaged_weights_stays_aligned(tmp_path):
    import onnx
    import torch
    from onnx import numpy_helper

    import workbench as wb

    class Seq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 8, batch_first=True)
            self.gru = torch.nn.GRU(8, 8, batch_first=True)

        def forward(self, x):
            x, _ = self.lstm(torch.tanh(x))
            return self.gru(x)[0]

    torch.manual_seed(0)
    model, x = Seq().eval(), torch.randn(1, 6, 8)
    onx = wb.export(model, (x,), workspace=tmp_path, exporter="torchscript", opset=17)
    m = onnx.load(onx.path)
    node = next(n for n in m.graph.node if n.op_type == "LSTM")
    init = next(i for i in m.graph.initializer if i.name == node.input[1])
    w = numpy_helper.to_array(init).copy()
    flat = w.reshape(-1)
    idx = np.random.default_rng(0).choice(flat.size, flat.size // 4, replace=False)
    flat[idx] += 0.3 * np.abs(w).max() * np.random.default_rng(1).standard_normal(idx.size)
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    bad = tmp_path / "bad.onnx"
    onnx.save(m, bad)
    rep = wb.compare(model, [str(bad)], (x,))
    al = next(iter(rep.alignments.values()))
    assert al.pairs[node.output[0]] == "lstm.0"
    assert al.pairs[node.output[1]] == "lstm.1"
    assert rep.first_divergence.reference.startswith("lstm")
