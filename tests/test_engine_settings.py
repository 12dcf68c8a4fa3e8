"""The engine's settings agree between Python and C++ (see Note [engine
settings] in ops/core/engine_settings.def): the same names, the same
defaults, and the text form that crosses the C API reaches the engine.

No MPI job: the library is loaded, the engine is only asked to start with
settings it must refuse.
"""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
from mpi4py import MPI  # noqa: F401  (the engine refuses to start before MPI_Init)

from hvdkeras.engine import c_api, library
from hvdkeras.engine.config import EngineConfig

pytestmark = pytest.mark.usefixtures("op_library_built")


def _engine_defaults() -> dict:
    return c_api.parse_settings(library.handle().hvdkeras_engine_default_settings().decode())


def _as_python(text: str, like):
    if isinstance(like, bool):
        return {"1": True, "0": False}[text]
    return type(like)(text)


def test_both_sides_list_the_same_settings_in_the_same_order():
    assert list(_engine_defaults()) == [f.name for f in dataclasses.fields(EngineConfig)]


def test_both_sides_have_the_same_defaults():
    python = dataclasses.asdict(EngineConfig())
    engine = {name: _as_python(text, python[name]) for name, text in _engine_defaults().items()}
    assert engine == python


def test_settings_text_round_trips_every_value():
    config = dataclasses.replace(EngineConfig(), cycle_time_ms=0.1, timeline_path="/tmp/a=b.json",
                                 autotune=True, fusion_threshold=0)
    parsed = c_api.parse_settings(c_api.settings_text(config))
    assert parsed["timeline_path"] == "/tmp/a=b.json" and parsed["autotune"] == "1"
    assert float(parsed["cycle_time_ms"]) == 0.1  # the shortest text that reads back exactly
    with pytest.raises(ValueError, match="timeline_path may not contain a line break"):
        c_api.settings_text(dataclasses.replace(config, timeline_path="a\nb"))


@pytest.mark.parametrize("text, message", [
    ("fusion_treshold=1\n", "unknown engine setting 'fusion_treshold'"),
    ("autotune=yes\n", "engine setting 'autotune' has a bad value 'yes'"),
])
def test_the_engine_refuses_what_it_does_not_know(text, message):
    error = ctypes.create_string_buffer(c_api.ERROR_CAPACITY)
    # The settings are checked before the communicator is used: 0 is no communicator.
    rc = library.handle().hvdkeras_engine_start(0, text.encode(), error, len(error))
    assert rc == 1 and error.value.decode() == message
    assert library.handle().hvdkeras_engine_running() == 0
