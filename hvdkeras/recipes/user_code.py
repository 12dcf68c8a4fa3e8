"""User code a recipe names as "package.module:function": importing it and
reading which keyword arguments it takes.

What may import this module: the rest of `hvdkeras.recipes` (standard
library and the pure `spec` only).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any, Callable, Optional

from hvdkeras.recipes.spec import Context, did_you_mean


def import_function(target: str) -> Callable[..., Any]:
    """`package.module:function` -> the function (ImportError/AttributeError if not there)."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    function = getattr(module, attribute)
    if not callable(function):
        raise TypeError(f"{target} is a {type(function).__name__}, not a function")
    return function


def accepted_parameters(function: Callable[..., Any]) -> Optional[set]:
    """The keyword names `function` accepts, or None if it takes **kwargs."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    names = set()
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              inspect.Parameter.KEYWORD_ONLY):
            names.add(parameter.name)
    return names


def keyword_parameters(function: Callable[..., Any]) -> Optional[set]:
    """Keyword names accepted by a function or class (through **kwargs to bases);
    None when it takes any."""
    if not isinstance(function, type):
        return accepted_parameters(function)
    names: set = set()
    for cls in function.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        accepted = accepted_parameters(init)
        if accepted is not None:
            return names | (accepted - {"self"})
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return None
        names |= {p.name for p in parameters if p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)} - {"self"}
    return names or None


def import_target(target: str, path: tuple, out: Context, what: str) -> Optional[Callable]:
    """The function `target` names, or None after reporting why it cannot be had to `out`."""
    try:
        return import_function(target)
    except ModuleNotFoundError as error:
        out.error(path, f"cannot import module {error.name!r} for {what} {target!r}"
                        f" (is it installed or on PYTHONPATH?)")
    except AttributeError:
        module = target.partition(":")[0]
        names = [n for n in dir(sys.modules.get(module)) if not n.startswith("_")]
        out.error(path, f"module {module!r} has no function {target.partition(':')[2]!r}"
                        f"{did_you_mean(target.partition(':')[2], names)}")
    except TypeError as error:
        out.error(path, str(error))
    except Exception as error:  # the module raised while importing
        out.error(path, f"importing {target!r} failed: {type(error).__name__}: {error}")
    return None
