"""An ncnn model's files as ncnn will take them: which layers it cannot create."""

from __future__ import annotations

from pathlib import Path


def unloadable_layers(param: Path) -> list[tuple[str, str]]:
    """(layer type, layer name) of every layer in an ncnn param that ncnn cannot create."""
    import ncnn

    from ..customops import is_custom_layer

    bad = []
    lines = param.read_text().splitlines()[2:]
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and ncnn.layer_to_index(parts[0]) < 0 and not is_custom_layer(
                parts[0]):
            bad.append((parts[0], parts[1]))
    return bad
