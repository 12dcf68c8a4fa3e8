"""User code a recipe names as "package.module:function": importing it and
reading which keyword arguments it takes.

What may import this module: the rest of `hvdkeras.recipes` (standard
library only).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Optional


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
