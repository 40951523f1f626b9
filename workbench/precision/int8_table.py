"""ncnn's int8 calibration table: the text ``ncnn2table`` writes and ``ncnn2int8`` reads.

For every Convolution, ConvolutionDepthWise and InnerProduct layer the table holds

- ``<layer>_param_0 s0 s1 ...``: its weight scales, one per output channel (per group for a
  depthwise convolution; ``weight_scales``);
- ``<layer> s``: the scale of the blob it reads, ``127 / threshold`` (``thresholds``).

Format after ncnn's ``tools/quantize/ncnn2table.cpp`` (ncnn 1.0.20261020, the wheel
installed here; source at Tencent/ncnn a4d2ea1): scales printed with ``%f``, each value
followed by a space, weight lines first, then blob lines, no blank line (ncnn2int8 stops
reading at one).

A MultiHeadAttention gets ncnn2table's four weight lines (``<layer>_param_0`` to ``_3``:
127 / absmax of each row of its q, k and v weights, one for all of out) and no blob line.
A Gemm gets no line: ncnn2table writes none, and ncnn2int8's ``quantize_gemm`` quantizes
every Gemm from its constant weights alone (``ncnn_int8``), its input quantized per row at
run time by ncnn's Gemm.

Two additions ncnn2int8 reads harmlessly (a key with no layer of that name, or a key with
``_param_`` that no layer asks for): a first line ``#workbench method=kl samples=32``, and
the lines of layers kept in float written commented out (``#conv1_param_0 ...``, ``#conv1
...``; ncnn's README says to comment the weight line only, but ncnn2int8 then stops
quantizing the layers after it, so both lines are commented).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFileError
from ..fileio import atomic_write_text

_HEADER = "#workbench"


@dataclass
class Int8Table:
    """An ncnn int8 calibration table.

    ``weight_scales``: layer name -> its per-output-channel weight scales (per group for a
    depthwise convolution); ``blob_scales``: layer name -> the scale(s) of the blob it reads
    (one value as ncnn2table writes); ``float_layers``: layers kept in float (their lines
    commented out); ``method`` and ``samples``: how the table was made (None when read from
    a table ncnn2table wrote); ``thresholds``: layer name -> (absmax, threshold) of its input
    blob, for reports (not written)."""

    weight_scales: dict[str, Any] = field(default_factory=dict)
    blob_scales: dict[str, Any] = field(default_factory=dict)
    method: str | None = None
    samples: int | None = None
    float_layers: list[str] = field(default_factory=list)
    thresholds: dict[str, tuple[float, float]] = field(default_factory=dict)
    # layer name -> its ``_param_1``, ``_param_2``, ... weight scales (a MultiHeadAttention's
    # k, v and out weights; an RNN's second weights, read and kept, not applied)
    more_weight_scales: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def layers(self) -> list[str]:
        """Every layer the table has a line for (float ones included), in table order."""
        seen = dict.fromkeys(list(self.weight_scales) + list(self.blob_scales)
                             + self.float_layers)
        return list(seen)

    def text(self) -> str:
        """The table in ncnn2table's text format (see the module's docstring)."""
        out = []
        if self.method is not None or self.samples is not None:
            out.append(f"{_HEADER} method={self.method} samples={self.samples}")
        floats = set(self.float_layers)
        for name, scales in self.weight_scales.items():
            mark = "#" if name in floats else ""
            out.append(f"{mark}{name}_param_0 " + "".join(f"{float(s):f} " for s in scales))
            for i, more in enumerate(self.more_weight_scales.get(name, ()), 1):
                out.append(f"{mark}{name}_param_{i} " + "".join(f"{float(s):f} "
                                                               for s in more))
        for name, scales in self.blob_scales.items():
            mark = "#" if name in floats else ""
            out.append(f"{mark}{name} " + "".join(f"{float(s):f} " for s in scales))
        return "".join(line + "\n" for line in out)

    def write(self, path: str | Path) -> Path:
        """Write the table to ``path`` atomically (a temp file and a rename)."""
        path = Path(path)
        atomic_write_text(path, self.text())
        return path


def read_table(path: str | Path) -> Int8Table:
    """Read a calibration table as ncnn2int8 does: ``<layer>_param_<n>`` lines are weight
    scales, other lines blob scales; ``#``-commented lines name layers kept in float.

    Args:
        path: a table written by ``Int8Table.write`` or by ncnn's ncnn2table.

    Returns:
        The Int8Table: ``_param_0`` lines in ``weight_scales``, ``_param_1`` on in
        ``more_weight_scales`` (a MultiHeadAttention's k, v and out weights). Raises ModelFileError naming the line that is not a table line.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"calibration table {str(path)!r} is not a file",
                             "write one with calibration_table(...).write(path), or pass the "
                             "file ncnn2table wrote")
    table = Int8Table()
    floats: dict[str, None] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                 .splitlines(), 1):
        parts = raw.split()
        if not parts:
            break  # ncnn2int8 stops at an empty line: so do we, or we would read more
        key, values = parts[0], parts[1:]
        if key == _HEADER:
            _read_header(table, values)
            continue
        commented = key.startswith("#")
        key = key.lstrip("#")
        if not key:
            continue  # a comment
        scales = _scales(values, commented, path, lineno, raw)
        if scales is not None:
            _add_line(table, floats, key, scales, commented)
    table.float_layers = list(floats)
    return table


def _read_header(table: Int8Table, values: list[str]) -> None:
    """``method=`` and ``samples=`` of the ``#workbench`` line."""
    info = dict(v.split("=", 1) for v in values if "=" in v)
    table.method = None if info.get("method") in (None, "None") else info["method"]
    n = info.get("samples", "None")
    table.samples = int(n) if n.isdigit() else None


def _scales(values: list[str], commented: bool, path: Path, lineno: int, raw: str) -> Any:
    """The line's scales as float32; None for a comment that is not a commented-out table
    line; ModelFileError naming the line for anything else that is not numbers."""
    import numpy as np

    try:
        return np.array([float(v) for v in values], dtype=np.float32)
    except ValueError:
        if commented:
            return None  # a comment, not a commented-out table line
        raise ModelFileError(
            f"calibration table {path.name}, line {lineno}: expected '<name> <scale> "
            f"<scale> ...', got {raw.strip()[:80]!r}",
            "a table line is a layer name and its scales (ncnn2table's format); "
            "write the table again with calibration_table(...).write(path)") from None


def _add_line(table: Int8Table, floats: dict[str, None], key: str, scales: Any,
              commented: bool) -> None:
    """File one table line: ``_param_0`` as weight scales, ``_param_<n>`` as more weight
    scales, any other key as a blob scale; a commented line names a layer kept in float."""
    m = re.fullmatch(r"(.+)_param_(\d+)", key)
    name = m.group(1) if m is not None else key
    if m is not None and m.group(2) != "0":
        if scales.size:  # a MultiHeadAttention's k, v, out (an RNN's second weights)
            more = table.more_weight_scales.setdefault(name, [])
            more.extend([None] * (int(m.group(2)) - len(more)))
            more[int(m.group(2)) - 1] = scales
        return
    if commented:
        floats[name] = None
    if not scales.size:
        return
    if m is not None:
        table.weight_scales[name] = scales
    else:
        table.blob_scales[name] = scales
