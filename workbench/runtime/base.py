"""The Runner interface shared by every backend."""

from __future__ import annotations

from typing import Any

CAPTURES = ("outputs", "all")


class Runner:
    """Runs one model on one backend. ``run`` returns {tensor name: numpy array}."""

    name = "runner"

    @property
    def input_names(self) -> list[str]:
        raise NotImplementedError

    def run(self, inputs: Any, capture: str = "outputs") -> dict[str, Any]:
        raise NotImplementedError

    def _check_capture(self, capture: str) -> None:
        from ..errors import InputError

        if capture not in CAPTURES:
            raise InputError(f"capture={capture!r} is not one of {CAPTURES}",
                             "use capture='outputs' (graph outputs) or 'all' (every tensor)")
