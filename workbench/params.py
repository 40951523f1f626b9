"""Parsers for the text graphs pnnx writes: ncnn ``.ncnn.param`` and pnnx ``.pnnx.param``.

Plain text read with the standard library only (no ncnn, pnnx or torch), so a summary or an
alignment can see the graph without loading weights. Malformed files raise
:class:`~workbench.errors.ModelFileError` naming the file, the line, what was expected and
what came.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ModelFileError

if TYPE_CHECKING:
    from .graph import Dim

MAGIC = 7767517
"""First line of both formats."""

GLUE_LAYERS = frozenset({"Split", "MemoryData"})
"""ncnn layers that move or hold data but compute nothing a PyTorch module did."""

PNNX_IO_OPS = frozenset({"pnnx.Input", "pnnx.Output"})
_PACKING_OPS = frozenset({"prim::TupleConstruct", "prim::ListConstruct"})

# pnnx type codes -> numpy-style names (as GraphSummary uses), and their item sizes
_PNNX_DTYPES = {
    "f32": ("float32", 4), "f64": ("float64", 8), "f16": ("float16", 2),
    "bf16": ("bfloat16", 2), "i32": ("int32", 4), "i64": ("int64", 8), "i16": ("int16", 2),
    "i8": ("int8", 1), "u8": ("uint8", 1), "bool": ("bool", 1), "c64": ("complex64", 8),
    "c128": ("complex128", 16), "c32": ("complex32", 4),
}
_PYTORCH_PREFIXES = ("pnnx.", "nn.", "F.", "torch.", "Tensor.", "prim::", "aten::")
_NCNN_TYPES = frozenset({"Input", "Convolution", "Split", "MemoryData", "InnerProduct",
                         "Pooling", "BinaryOp", "Concat", "Interp", "ReLU"})  # pnnx never writes
_NOTE = re.compile(r"\((?P<dims>[^()]*)\)(?P<dtype>[A-Za-z][A-Za-z0-9]*)")
_NCNN_TOKEN = re.compile(r'(?:[^\s"]+|"[^"]*")+')
_HEAD = 4096


# -- records ------------------------------------------------------------------------------------


@dataclass
class NcnnLayer:
    """One layer line: ``type name #bottoms #tops bottoms... tops... key=value...``."""

    type: str
    name: str
    bottoms: list[str]
    tops: list[str]
    params: dict[int, str | list[str]]  # text as written; arrays (-233xx=N,a,b / a,b) as lists
    line: int
    glue: bool = field(init=False)  # Split / MemoryData: no PyTorch op behind it

    def __post_init__(self) -> None:
        self.glue = self.type in GLUE_LAYERS


@dataclass
class NcnnParam:
    """An ncnn ``.param`` graph; blob lists are in order of production (as ncnn numbers them)."""

    path: Path
    layers: list[NcnnLayer]
    blobs: list[str]
    inputs: list[str]  # tops of the Input layers
    outputs: list[str]  # blobs produced and never consumed (ncnn's own output_names order)
    producers: dict[str, str]  # blob -> name of the layer that writes it
    consumers: dict[str, list[str]]  # blob -> names of the layers that read it

    @property
    def glue_layers(self) -> list[NcnnLayer]:
        return [la for la in self.layers if la.glue]

    def layer(self, name: str) -> NcnnLayer:
        for la in self.layers:
            if la.name == name:
                return la
        raise KeyError(f"no layer named {name!r} in {self.path.name}")


@dataclass(frozen=True)
class PnnxAttr:
    """A stored tensor of an op (``@weight=(64,3,9,9)f32``): its shape and dtype, not its data."""

    shape: tuple[int, ...]
    dtype: str  # numpy-style name ("float32"); an unknown pnnx code is kept as written

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * _itemsize(self.dtype)


@dataclass
class PnnxOp:
    """One op line; ``type`` is the PyTorch API name (``nn.Conv2d``, ``F.upsample``, ...)."""

    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: dict[str, str]  # raw text as written: "(9,9)", "zeros", "True", "None"
    attrs: dict[str, PnnxAttr]
    input_names: dict[str, str]  # argument name -> operand, from ``$input=0``
    line: int
    module: str | None = field(init=False)  # nn.* ops: the module's qualified name

    def __post_init__(self) -> None:
        self.module = self.name if self.type.startswith("nn.") else None


@dataclass
class PnnxOperand:
    """A tensor between ops; shape and dtype come from the ``#name=(...)dtype`` notes."""

    name: str
    shape: tuple[Dim, ...] | None  # None when pnnx wrote no note (unknown, or a 0-d scalar)
    dtype: str | None
    producer: str  # op name
    consumers: list[str]
    module: str | None  # the PyTorch module that produced it, when an nn.* op did


@dataclass
class PnnxParam:
    """A pnnx ``.pnnx.param`` graph."""

    path: Path
    ops: list[PnnxOp]
    operands: dict[str, PnnxOperand]  # in order of production
    inputs: list[str]  # operands of the pnnx.Input ops
    outputs: list[str]  # operands fed to pnnx.Output, tuples/lists unpacked

    @property
    def module_map(self) -> dict[str, tuple[str, str | None]]:
        """operand -> (producing op name, PyTorch module name or None)."""
        return {n: (o.producer, o.module) for n, o in self.operands.items()}

    def op(self, name: str) -> PnnxOp:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"no op named {name!r} in {self.path.name}")


# -- reading and errors -------------------------------------------------------------------------


def _itemsize(dtype: str) -> int:
    for name, size in _PNNX_DTYPES.values():
        if name == dtype:
            return size
    return 0


def _show(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _error(path: Path, line: int, expected: str, got: str, hint: str) -> ModelFileError:
    return ModelFileError(f"{str(path)!r}, line {line}: expected {expected}, got {got}", hint)


def _read_lines(path: str | Path, kind: str) -> tuple[Path, list[str]]:
    """The file's lines (numbered from 1 by index + 1), after checking it is a text file."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"{kind} param file {str(path)!r} does not exist",
                             "check the path; pnnx writes <name>.ncnn.param and "
                             "<name>.pnnx.param next to the model it converted")
    if path.is_dir():
        raise ModelFileError(f"{kind} param file {str(path)!r} is a folder, expected a file",
                             f"pass the .{kind}.param file inside it")
    with open(path, "rb") as f:
        data = f.read(_HEAD)  # a weights file passed by mistake is refused before it is read
        bad = _binary_at(data, final=False)
        if bad < 0:
            data += f.read()
            bad = _binary_at(data, final=True)
    if bad >= 0:
        line = data[:bad].count(b"\n") + 1
        raise _error(path, line, f"a text {kind} param file",
                     f"binary data (byte {data[bad:bad + 1]!r} at offset {bad})",
                     _binary_hint(data, kind))
    text = data.decode("utf-8")
    return path, [ln.rstrip("\r") for ln in text.split("\n")]


def _binary_at(data: bytes, final: bool) -> int:
    """Offset of the first NUL or non-UTF-8 byte, or -1 when ``data`` reads as text."""
    nul = data.find(b"\x00")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=final)
    except UnicodeDecodeError as e:
        return e.start if nul < 0 else min(nul, e.start)
    return nul


def _binary_hint(data: bytes, kind: str) -> str:
    if data[:4] == MAGIC.to_bytes(4, "little"):
        return ("this is ncnn's binary param (.param.bin, as ncnn2mem writes it); these "
                "parsers read the text .param that pnnx writes")
    if data[:4] == b"PK\x03\x04":
        return (f"this is a zip archive (pnnx keeps weights in .pnnx.bin as one); pass the "
                f".{kind}.param file instead")
    return (f"this looks like a weights file (.bin) or another binary; pass the .{kind}.param "
            "text file that pnnx wrote next to it")


def _header(path: Path, lines: list[str], kind: str, what: tuple[str, str]) -> tuple[int, int]:
    """Check the magic on line 1 and return the two counts on line 2."""
    first = lines[0].strip() if lines else ""
    if first != str(MAGIC):
        got = "an empty file" if not any(ln.strip() for ln in lines) else _show(first)
        article = "an" if kind == "ncnn" else "a"
        raise _error(path, 1, f"the magic number {MAGIC}", got,
                     f"{article} {kind} .param file starts with the line {MAGIC}; this is not "
                     "one (an ONNX file, a .bin, or a file from another tool?)")
    parts = lines[1].split() if len(lines) > 1 else []
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        got = _show(lines[1]) if len(lines) > 1 else "end of file"
        raise _error(path, 2, f"two counts '<{what[0]} count> <{what[1]} count>'", got,
                     "line 2 of a .param file holds the two counts; the file is damaged or "
                     "truncated; write it again with pnnx")
    return int(parts[0]), int(parts[1])


def _body(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank record lines after the two header lines."""
    return [(i + 1, ln) for i, ln in enumerate(lines) if i >= 2 and ln.strip()]


def _check_count(path: Path, lines: list[str], body: list[tuple[int, str]], count: int,
                 what: str) -> None:
    """After the lines parsed (a cut line says more than a short count), match line 2."""
    if len(body) > count:
        lineno, text = body[count]
        raise _error(path, lineno, f"end of file after {count} {what}s (line 2 declares "
                     f"{count})", f"another {what} line {_show(text.strip())}",
                     f"fix the {what} count on line 2 ({len(body)} {what} lines follow), or "
                     "remove the extra lines")
    if len(body) < count:
        last = max((i + 1 for i, ln in enumerate(lines) if ln.strip()), default=2)
        raise _error(path, last + 1, f"{count} {what} lines (line 2 declares {count})",
                     f"end of file after {len(body)}",
                     "the file is truncated (an interrupted write or copy?) or line 2 is "
                     "wrong; write it again with pnnx")


def _counts(path: Path, lineno: int, toks: list[str], text: str, what: str,
            ends: tuple[str, str]) -> tuple[int, int]:
    if len(toks) < 4:
        raise _error(path, lineno, f"'<type> <name> <{ends[0]} count> <{ends[1]} count> ...'",
                     f"{len(toks)} field(s): {_show(text.strip())}",
                     f"the {what} line is truncated; write the file again with pnnx")
    for pos, (tok, end) in enumerate(zip(toks[2:4], ends, strict=True), start=3):
        if not tok.isdigit():
            raise _error(path, lineno, f"the {end} count (a whole number) as field {pos}",
                         _show(tok), f"a {what} line is '<type> <name> <{ends[0]} count> "
                         f"<{ends[1]} count> {ends[0]}s... {ends[1]}s... key=value...'")
    return int(toks[2]), int(toks[3])


def _names(path: Path, lineno: int, toks: list[str], n_in: int, n_out: int,
           thing: str) -> tuple[list[str], list[str]]:
    names = toks[4:4 + n_in + n_out]
    k = next((i for i, t in enumerate(names) if "=" in t), len(names))
    if k < n_in + n_out:
        where = f"a parameter {_show(names[k])}" if k < len(names) else "the end of the line"
        raise _error(path, lineno, f"{n_in} input and {n_out} output {thing} name(s)",
                     f"{k} name(s), then {where}",
                     "the line is truncated, or its counts (fields 3 and 4) are wrong")
    return names[:n_in], names[n_in:]


def _link(path: Path, lineno: int, name: str, ins: list[str], outs: list[str],
          producers: dict[str, str], consumers: dict[str, list[str]], thing: str) -> None:
    for b in ins:
        if b not in producers:
            raise _error(path, lineno, f"input {thing} {b!r} of {name!r} to be produced by an "
                         "earlier line", "no line before it produces it",
                         "lines must be in execution order and every input must be written "
                         "first; the file was edited or is damaged")
        consumers[b].append(name)
    for b in outs:
        if b in producers:
            raise _error(path, lineno, f"a new {thing} name", f"{b!r}, already produced by "
                         f"{producers[b]!r}", f"every {thing} is written by exactly one line; "
                         "rename one of them")
        producers[b] = name
        consumers[b] = []


# -- ncnn ---------------------------------------------------------------------------------------


def parse_ncnn_param(path: str | Path) -> NcnnParam:
    """Parse an ncnn text ``.param`` (as pnnx or the ncnn converters write it)."""
    path, lines = _read_lines(path, "ncnn")
    layer_count, blob_count = _header(path, lines, "ncnn", ("layer", "blob"))
    layers: list[NcnnLayer] = []
    producers: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    body = _body(lines)
    for lineno, text in body:
        if text.count('"') % 2:
            raise _error(path, lineno, "a closing '\"' for a string parameter",
                         f"end of line in {_show(text.strip())}",
                         "the line is truncated; write the file again with pnnx")
        toks = _NCNN_TOKEN.findall(text)
        n_in, n_out = _counts(path, lineno, toks, text, "layer", ("bottom", "top"))
        kind, name = toks[0], toks[1]
        if kind.startswith(_PYTORCH_PREFIXES):
            raise _error(path, lineno, "an ncnn layer type (Convolution, Split, ...)",
                         _show(kind), "this is a pnnx graph (.pnnx.param); read it with "
                         "parse_pnnx_param")
        bottoms, tops = _names(path, lineno, toks, n_in, n_out, "blob")
        params = {}
        for tok in toks[4 + n_in + n_out:]:
            key, value = _ncnn_param(path, lineno, tok)
            params[key] = value
        _link(path, lineno, name, bottoms, tops, producers, consumers, "blob")
        layers.append(NcnnLayer(kind, name, bottoms, tops, params, lineno))
    _check_count(path, lines, body, layer_count, "layer")
    if len(producers) != blob_count:
        raise _error(path, 2, f"{blob_count} blobs (the second count on line 2)",
                     f"{len(producers)} distinct blob names in the {layer_count} layers",
                     "line 2 is '<layer count> <blob count>'; fix the blob count, or write "
                     "the file again with pnnx")
    return NcnnParam(
        path=path, layers=layers, blobs=list(producers),
        inputs=[t for la in layers if la.type == "Input" for t in la.tops],
        outputs=[b for b, c in consumers.items() if not c],
        producers=producers, consumers=consumers)


def _ncnn_param(path: Path, lineno: int, tok: str) -> tuple[int, str | list[str]]:
    key, eq, value = tok.partition("=")
    hint = ("ncnn parameters are 'id=value' with an integer id, arrays as "
            "'-233xx=count,v1,v2,...'; the line is damaged or truncated")
    if not eq or not re.fullmatch(r"-?\d+", key):
        raise _error(path, lineno, "a parameter 'id=value' with an integer id", _show(tok), hint)
    if value == "":
        raise _error(path, lineno, f"a value after '{key}='", "nothing", hint)
    k = int(key)
    if k <= -23300:
        count, *items = value.split(",")
        if not count.isdigit() or len(items) != int(count) or "" in items:
            raise _error(path, lineno, f"an array '{key}=count,v1,v2,...' of as many values as "
                         "its count", _show(tok), hint)
        return k, items
    if "," in value and not value.startswith('"'):
        items = value.split(",")
        if "" in items:
            raise _error(path, lineno, "an array 'v1,v2,...' with no empty value",
                         _show(tok), hint)
        return k, items
    return k, value


# -- pnnx ---------------------------------------------------------------------------------------


def parse_pnnx_param(path: str | Path) -> PnnxParam:
    """Parse a pnnx ``.pnnx.param``: ops named as the PyTorch API, shapes from the notes."""
    path, lines = _read_lines(path, "pnnx")
    op_count, operand_count = _header(path, lines, "pnnx", ("op", "operand"))
    ops: list[PnnxOp] = []
    producers: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    notes: dict[str, tuple[tuple[Dim, ...], str]] = {}
    body = _body(lines)
    for lineno, text in body:
        toks = text.split()
        n_in, n_out = _counts(path, lineno, toks, text, "op", ("input", "output"))
        kind, name = toks[0], toks[1]
        if kind in _NCNN_TYPES:
            raise _error(path, lineno, "a pnnx op type named as PyTorch names it "
                         "(pnnx.Input, nn.Conv2d, F.relu, ...)", _show(kind),
                         "this is an ncnn graph (.ncnn.param); read it with parse_ncnn_param")
        ins, outs = _names(path, lineno, toks, n_in, n_out, "operand")
        op = PnnxOp(kind, name, ins, outs, {}, {}, {}, lineno)
        for tok in toks[4 + n_in + n_out:]:
            _pnnx_item(path, lineno, op, tok, notes)
        _link(path, lineno, name, ins, outs, producers, consumers, "operand")
        ops.append(op)
    _check_count(path, lines, body, op_count, "op")
    if len(producers) != operand_count:
        raise _error(path, 2, f"{operand_count} operands (the second count on line 2)",
                     f"{len(producers)} distinct operand names in the {op_count} ops",
                     "line 2 is '<op count> <operand count>'; fix the operand count, or write "
                     "the file again with pnnx")
    by_name = {o.name: o for o in ops}
    operands = {}
    for n, prod in producers.items():
        shape, dtype = notes.get(n, (None, None))
        operands[n] = PnnxOperand(n, shape, dtype, prod, consumers[n], by_name[prod].module)
    inputs = [r for o in ops if o.type == "pnnx.Input" for r in o.outputs]
    outputs: list[str] = []
    for o in ops:
        if o.type == "pnnx.Output":
            for r in o.inputs:
                outputs += _unpack(r, operands, by_name)
    return PnnxParam(path, ops, operands, inputs, outputs)


def _unpack(name: str, operands: dict[str, PnnxOperand], by_name: dict[str, PnnxOp]) -> list[str]:
    """A graph output built by prim::TupleConstruct/ListConstruct stands for its elements."""
    prod = by_name[operands[name].producer]
    if prod.type in _PACKING_OPS:
        return [x for r in prod.inputs for x in _unpack(r, operands, by_name)]
    return [name]


def _pnnx_item(path: Path, lineno: int, op: PnnxOp, tok: str,
               notes: dict[str, tuple[tuple[Dim, ...], str]]) -> None:
    key, eq, value = tok.partition("=")
    if not eq or key in ("", "@", "$", "#"):
        raise _error(path, lineno, "'key=value' (a parameter, @attribute, $input or #shape)",
                     _show(tok), "the line is damaged or truncated; write it again with pnnx")
    sigil, bare = key[0], key[1:]
    if sigil in "@#":
        m = _NOTE.fullmatch(value)
        dims = m["dims"].split(",") if m and m["dims"] else []
        ok = m is not None and all(re.fullmatch(r"-?\d+", d) or (
            sigil == "#" and re.fullmatch(r"\?|%\w+", d)) for d in dims)
        if not ok:
            example = "(64,3,9,9)f32" if sigil == "@" else "(1,3,?,?)f32"
            raise _error(path, lineno, f"'{key}=<shape><dtype>' like '{key}={example}'",
                         _show(tok), "the line is damaged or truncated; write it again "
                         "with pnnx")
        dtype = _PNNX_DTYPES.get(m["dtype"], (m["dtype"], 0))[0]
        if sigil == "@":
            op.attrs[bare] = PnnxAttr(tuple(int(d) for d in dims), dtype)
            return
        if bare not in op.inputs and bare not in op.outputs:
            raise _error(path, lineno, f"a shape note for an operand of {op.name!r} (one of "
                         f"{op.inputs + op.outputs})", _show(tok),
                         "a #note names one of the op's own inputs or outputs; the line was "
                         "edited or is damaged")
        shape = tuple(None if d == "?" else d[1:] if d.startswith("%") else int(d)
                      for d in dims)
        notes.setdefault(bare, (shape, dtype))
    elif sigil == "$":
        op.input_names[bare] = value
    else:
        if value[:1] in "([" and value[-1:] != {"(": ")", "[": "]"}[value[0]]:
            raise _error(path, lineno, f"a closing '{')' if value[0] == '(' else ']'}' in "
                         f"parameter {key!r}", _show(tok),
                         "the line is truncated; write it again with pnnx")
        op.params[key] = value
