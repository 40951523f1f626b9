"""Model factories: a ``"module:function"`` (or ``"path/file.py:function"``) spec, a zoo name or
a callable, resolved to the function and called with hinted errors.

The ``workbench`` command and the sweep both load models this way; a sweep's child process gets
the spec as text, so a callable is turned into a spec it can import again.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputError

ZOO_MODULE = "workbench.zoo"


def resolve(spec: str) -> Callable[[], Any]:
    """'package.module:factory', 'path/to/file.py:factory' or a zoo name -> the factory."""
    from ..zoo import _ALL

    if ":" not in spec and spec in _ALL:
        spec = f"{ZOO_MODULE}:{spec}"
    mod_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise InputError(f"model {spec!r}: expected MODULE:FACTORY or a zoo name "
                         f"({', '.join(_ALL)})",
                         "e.g. workbench export mypkg.models:make_net --input 1x3x224x224")
    try:
        if mod_name.endswith(".py") or Path(mod_name).is_file():
            path = Path(mod_name)
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            if module_spec is None or module_spec.loader is None or not path.is_file():
                raise ImportError(f"no file {path}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except ImportError as e:
        raise InputError(f"model {spec!r}: cannot import {mod_name!r} ({e})",
                         "run from the folder that holds it, or give a path to a .py file"
                         ) from e
    except Exception as e:  # the module's own code failed as it was imported
        raise InputError(f"model {spec!r}: importing {mod_name!r} raised "
                         f"{type(e).__name__}: {e}{where(e)}",
                         f"fix {mod_name} (run `python -c 'import {mod_name}'` to see the "
                         "whole traceback)") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(f"model {spec!r}: {mod_name} has no callable {attr!r}",
                         f"define def {attr}(): return MyNet() in {mod_name}")
    return factory


def call(factory: Callable[[], Any], spec: str) -> Any:
    """``factory()``, its exception turned into a hinted InputError naming ``spec``."""
    attr = getattr(factory, "__name__", spec)
    try:
        return factory()
    except Exception as e:
        raise InputError(f"model {spec!r}: {attr}() raised {type(e).__name__}: {e}{where(e)}",
                         f"{attr}() must build the model and return it; call it in Python to "
                         "see the whole traceback") from e


def load_factory(spec: str) -> Any:
    """'package.module:factory' or 'path/to/file.py:factory' -> the object factory() returns."""
    return call(resolve(spec), spec)


def model_and_inputs(spec: str) -> tuple[Any, tuple]:
    """Build the model of ``spec``: the factory must return ``(model, example_inputs)``."""
    got = load_factory(spec)  # first: a factory that fails says so without importing torch
    import torch

    hint = ("a sweep's factory returns (model, example_inputs), e.g. "
            "return Net().eval(), (torch.rand(1, 3, 64, 64),)")
    if got is None:
        raise InputError(f"model {spec!r}: the factory returned None, expected "
                         "(model, example_inputs)", hint)
    if isinstance(got, torch.nn.Module):
        raise InputError(f"model {spec!r}: the factory returned a bare {type(got).__name__}, "
                         "expected (model, example_inputs)", hint)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise InputError(f"model {spec!r}: the factory returned {type(got).__name__}, expected "
                         "(model, example_inputs)", hint)
    model, inputs = got
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model {spec!r}: the factory's model is {type(model).__name__}, "
                         "expected a torch.nn.Module", hint)
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return model.eval(), tuple(inputs)


def spec_of(thing: Any) -> str:
    """The text spec a fresh process can load ``thing`` from (a spec string as it is)."""
    if isinstance(thing, str):
        if not thing.strip():
            raise InputError("model '': expected MODULE:FACTORY or a zoo name",
                             "e.g. 'workbench.zoo:resnet' or 'resnet'")
        return thing
    if not callable(thing):
        raise InputError(f"model {thing!r}: expected a factory (a 'module:function' string or a "
                         f"callable returning (model, example_inputs)), got {type(thing).__name__}",
                         "pass the function that builds the model, not the model itself")
    qualname = getattr(thing, "__qualname__", "")
    module = inspect.getmodule(thing)
    if not qualname or "<" in qualname or "." in qualname or module is None:
        raise InputError(f"model {thing!r}: a sweep runs each cell in a fresh process, which "
                         "can only load a module-level function",
                         "define the factory with def at the top level of a module (or pass "
                         "'module:function')")
    if module.__name__ == "__main__" or module.__spec__ is None:
        source = getattr(module, "__file__", None)
        if not source:
            raise InputError(f"model {qualname!r} is defined in an interactive session, which "
                             "a fresh process cannot import",
                             "put the factory in a .py file and pass 'path/to/file.py:"
                             f"{qualname}'")
        return f"{Path(source).resolve()}:{qualname}"
    return f"{module.__name__}:{qualname}"


def name_of(spec: str) -> str:
    """A short name for a model spec: the factory's name ('workbench.zoo:vit' -> 'vit')."""
    return spec.rpartition(":")[2] or spec


def where(e: BaseException) -> str:
    """' (at file:line)' of the innermost frame of ``e``'s traceback, or ''."""
    frames = traceback.extract_tb(e.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
