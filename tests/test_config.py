"""Unit tests of hvdkeras.engine.config: parsing and validating the HVDKERAS_* knobs.

Pure Python: no MPI job and no engine; `engine_config_from_env` is given
explicit mappings (and, once, the real environment through monkeypatch).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from hvdkeras.engine import config
from hvdkeras.engine.config import EngineConfig, engine_config_from_env

FUSION = config.FUSION_THRESHOLD
CYCLE = config.CYCLE_TIME
CACHE = config.CACHE_CAPACITY
STALL_CHECK = config.STALL_CHECK_SECONDS
STALL_DISABLE = config.STALL_CHECK_DISABLE
STALL_SHUTDOWN = config.STALL_SHUTDOWN_SECONDS
TIMELINE = config.TIMELINE
MARK_CYCLES = config.TIMELINE_MARK_CYCLES
AUTOTUNE = config.AUTOTUNE
AUTOTUNE_LOG = config.AUTOTUNE_LOG
CHUNK = config.ALLREDUCE_CHUNK_BYTES
SHM = config.SHM_ALLREDUCE
ARENA = config.SHM_ARENA_BYTES
ALL_KEYS = (FUSION, CYCLE, CACHE, STALL_CHECK, STALL_DISABLE, STALL_SHUTDOWN, TIMELINE,
            MARK_CYCLES, AUTOTUNE, AUTOTUNE_LOG, CHUNK, SHM, ARENA)


def test_variable_names():
    assert ALL_KEYS == (
        "HVDKERAS_FUSION_THRESHOLD",
        "HVDKERAS_CYCLE_TIME",
        "HVDKERAS_CACHE_CAPACITY",
        "HVDKERAS_STALL_CHECK_SECONDS",
        "HVDKERAS_STALL_CHECK_DISABLE",
        "HVDKERAS_STALL_SHUTDOWN_SECONDS",
        "HVDKERAS_TIMELINE",
        "HVDKERAS_TIMELINE_MARK_CYCLES",
        "HVDKERAS_AUTOTUNE",
        "HVDKERAS_AUTOTUNE_LOG",
        "HVDKERAS_ALLREDUCE_CHUNK_BYTES",
        "HVDKERAS_SHM_ALLREDUCE",
        "HVDKERAS_SHM_ARENA_BYTES",
    )


def test_defaults_from_empty_mapping():
    cfg = engine_config_from_env({})
    assert cfg == EngineConfig()
    assert cfg.fusion_threshold == 64 * 1024 * 1024
    assert cfg.cycle_time_ms == 1.0
    assert cfg.cache_capacity == 16384
    assert cfg.stall_check_seconds == 60.0
    assert cfg.stall_shutdown_seconds == 1800.0  # Note [hang bound]
    assert cfg.timeline_path == ""
    assert cfg.timeline_mark_cycles is False
    assert cfg.autotune is False
    assert cfg.autotune_log == ""
    assert cfg.fusion_threshold_fixed is False
    assert cfg.cycle_time_fixed is False


def test_unrelated_variables_are_ignored():
    env = {"PATH": "/bin", "HVDKERAS_SOMETHING_ELSE": "junk", "OMPI_X": "1"}
    assert engine_config_from_env(env) == EngineConfig()


@pytest.mark.parametrize("blank", ["", " ", "\t", "  \n"])
def test_blank_values_mean_default(blank):
    env = {key: blank for key in ALL_KEYS}
    assert engine_config_from_env(env) == EngineConfig()


def test_reads_os_environ_by_default(monkeypatch):
    for key in ALL_KEYS:
        monkeypatch.delenv(key, raising=False)
    assert engine_config_from_env() == engine_config_from_env({})
    monkeypatch.setenv(FUSION, "4096")
    monkeypatch.setenv(CYCLE, "0.5")
    monkeypatch.setenv(CACHE, "7")
    cfg = engine_config_from_env()
    assert (cfg.fusion_threshold, cfg.cycle_time_ms, cfg.cache_capacity) == (4096, 0.5, 7)


def test_config_is_frozen():
    cfg = engine_config_from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cycle_time_ms = 5.0  # type: ignore[misc]


# ---- each variable parsed ---------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [("0", 0), ("1", 1), ("4096", 4096), (" 128 ", 128), ("+64", 64),
     (str(1 << 40), 1 << 40)],
)
def test_fusion_threshold_parsed(raw, expected):
    cfg = engine_config_from_env({FUSION: raw})
    assert cfg.fusion_threshold == expected
    assert isinstance(cfg.fusion_threshold, int)
    # The other knobs keep their defaults.
    assert cfg.cycle_time_ms == EngineConfig().cycle_time_ms
    assert cfg.cache_capacity == EngineConfig().cache_capacity


@pytest.mark.parametrize(
    "raw, expected",
    [("1", 1.0), ("2.5", 2.5), ("0.001", 0.001), (" 10 ", 10.0), ("1e1", 10.0), ("5", 5.0)],
)
def test_cycle_time_parsed(raw, expected):
    cfg = engine_config_from_env({CYCLE: raw})
    assert cfg.cycle_time_ms == pytest.approx(expected)
    assert isinstance(cfg.cycle_time_ms, float)
    assert cfg.fusion_threshold == EngineConfig().fusion_threshold
    assert cfg.cache_capacity == EngineConfig().cache_capacity


@pytest.mark.parametrize("raw, expected", [("0", 0), ("1", 1), ("2048", 2048), (" 3 ", 3)])
def test_cache_capacity_parsed(raw, expected):
    cfg = engine_config_from_env({CACHE: raw})
    assert cfg.cache_capacity == expected
    assert isinstance(cfg.cache_capacity, int)
    assert cfg.fusion_threshold == EngineConfig().fusion_threshold
    assert cfg.cycle_time_ms == EngineConfig().cycle_time_ms


def test_all_three_together():
    cfg = engine_config_from_env({FUSION: "0", CYCLE: "3.25", CACHE: "0"})
    assert cfg == EngineConfig(fusion_threshold=0, cycle_time_ms=3.25, cache_capacity=0,
                               fusion_threshold_fixed=True, cycle_time_fixed=True)


def test_fixed_flags_record_explicit_settings():
    # A knob set in the environment is "fixed" (autotune leaves it alone),
    # even when set to its default value; blank counts as unset.
    assert engine_config_from_env({FUSION: "67108864"}).fusion_threshold_fixed is True
    assert engine_config_from_env({FUSION: "67108864"}).cycle_time_fixed is False
    assert engine_config_from_env({CYCLE: "1"}).cycle_time_fixed is True
    assert engine_config_from_env({CYCLE: "1"}).fusion_threshold_fixed is False
    assert engine_config_from_env({FUSION: " ", CYCLE: ""}) == EngineConfig()
    assert engine_config_from_env({CACHE: "5"}).fusion_threshold_fixed is False


@pytest.mark.parametrize("key, field", [(STALL_CHECK, "stall_check_seconds"),
                                        (STALL_SHUTDOWN, "stall_shutdown_seconds")])
@pytest.mark.parametrize("raw, expected", [("0", 0.0), ("0.0", 0.0), ("30", 30.0),
                                           ("2.5", 2.5), (" 120 ", 120.0), ("1e3", 1000.0)])
def test_stall_seconds_parsed(key, field, raw, expected):
    cfg = engine_config_from_env({key: raw})
    assert getattr(cfg, field) == expected
    assert isinstance(getattr(cfg, field), float)


TRUE_WORDS = ["1", "true", "TRUE", "True", "yes", "on", " On "]
FALSE_WORDS = ["0", "false", "False", "no", "off", "OFF"]


@pytest.mark.parametrize("key, field", [(MARK_CYCLES, "timeline_mark_cycles"),
                                        (AUTOTUNE, "autotune")])
def test_boolean_knobs_parsed(key, field):
    for raw in TRUE_WORDS:
        assert getattr(engine_config_from_env({key: raw}), field) is True, raw
    for raw in FALSE_WORDS:
        assert getattr(engine_config_from_env({key: raw}), field) is False, raw


def test_stall_check_disable():
    for raw in TRUE_WORDS:
        assert engine_config_from_env({STALL_DISABLE: raw}).stall_check_seconds == 0.0, raw
        # Disabling wins over an explicit interval.
        env = {STALL_DISABLE: raw, STALL_CHECK: "15"}
        assert engine_config_from_env(env).stall_check_seconds == 0.0, raw
    for raw in FALSE_WORDS:
        assert engine_config_from_env({STALL_DISABLE: raw}).stall_check_seconds == 60.0, raw
        env = {STALL_DISABLE: raw, STALL_CHECK: "15"}
        assert engine_config_from_env(env).stall_check_seconds == 15.0, raw
    # The shutdown timeout is separate.
    env = {STALL_DISABLE: "1", STALL_SHUTDOWN: "90"}
    assert engine_config_from_env(env).stall_shutdown_seconds == 90.0


@pytest.mark.parametrize("key, field", [(TIMELINE, "timeline_path"),
                                        (AUTOTUNE_LOG, "autotune_log")])
def test_path_knobs_taken_verbatim_but_stripped(key, field):
    assert getattr(engine_config_from_env({key: "/tmp/trace.json"}), field) == "/tmp/trace.json"
    assert getattr(engine_config_from_env({key: "  rel/out.csv \n"}), field) == "rel/out.csv"
    assert getattr(engine_config_from_env({key: "with space.json"}), field) == "with space.json"


def test_docstring_example():
    assert engine_config_from_env({"HVDKERAS_CYCLE_TIME": "2.5"}).cycle_time_ms == 2.5


# ---- bad values ----------------------------------------------------------------


def _assert_names_variable_and_value(excinfo, key, raw):
    message = str(excinfo.value)
    assert key in message, message
    assert raw.strip() in message, message


@pytest.mark.parametrize("raw, expected", [("0", 0), ("65536", 65536), (" 4194304 ", 4 << 20)])
def test_allreduce_chunk_bytes_parsed(raw, expected):
    assert EngineConfig().allreduce_chunk_bytes == 1 << 20
    assert engine_config_from_env({CHUNK: raw}).allreduce_chunk_bytes == expected


@pytest.mark.parametrize("raw, expected", [("0", 0), (" 1048576 ", 1 << 20)])
def test_shm_arena_bytes_parsed(raw, expected):
    assert EngineConfig().shm_arena_bytes == 64 << 20
    assert engine_config_from_env({ARENA: raw}).shm_arena_bytes == expected


@pytest.mark.parametrize("key", [FUSION, CACHE, CHUNK, ARENA])
@pytest.mark.parametrize("raw", ["abc", "1.5", "1e6", "0x10", "12kb", "one", "--1", "nan"])
def test_integer_knobs_reject_non_integers(key, raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({key: raw})
    _assert_names_variable_and_value(excinfo, key, raw)


@pytest.mark.parametrize("key", [FUSION, CACHE, CHUNK])
@pytest.mark.parametrize("raw", ["-1", "-4096", " -2 "])
def test_integer_knobs_reject_negative(key, raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({key: raw})
    _assert_names_variable_and_value(excinfo, key, raw)
    assert ">= 0" in str(excinfo.value)


@pytest.mark.parametrize("raw", ["abc", "1ms", "fast", "1,5", "--1"])
def test_cycle_time_rejects_non_numeric(raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({CYCLE: raw})
    _assert_names_variable_and_value(excinfo, CYCLE, raw)


@pytest.mark.parametrize("raw", ["0", "0.0", "-0", "-1", "-0.5", "-1e-9"])
def test_cycle_time_rejects_zero_and_negative(raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({CYCLE: raw})
    _assert_names_variable_and_value(excinfo, CYCLE, raw)
    assert "> 0" in str(excinfo.value)


@pytest.mark.parametrize("raw", ["nan", "NaN", "-nan"])
def test_cycle_time_rejects_nan(raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({CYCLE: raw})
    _assert_names_variable_and_value(excinfo, CYCLE, raw)


@pytest.mark.parametrize("key", [STALL_CHECK, STALL_SHUTDOWN])
@pytest.mark.parametrize("raw", ["-1", "-0.5", "nan", "soon", "10s", "1,5"])
def test_stall_seconds_reject_bad_values(key, raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({key: raw})
    _assert_names_variable_and_value(excinfo, key, raw)
    assert ">= 0" in str(excinfo.value)


def test_shm_allreduce_is_on_unless_turned_off():
    assert EngineConfig().shm_allreduce is True
    assert engine_config_from_env({}).shm_allreduce is True
    assert engine_config_from_env({SHM: "  "}).shm_allreduce is True
    for raw in TRUE_WORDS:
        assert engine_config_from_env({SHM: raw}).shm_allreduce is True, raw
    for raw in FALSE_WORDS:
        if raw.strip():
            assert engine_config_from_env({SHM: raw}).shm_allreduce is False, raw


@pytest.mark.parametrize("key", [MARK_CYCLES, AUTOTUNE, STALL_DISABLE, SHM])
@pytest.mark.parametrize("raw", ["2", "maybe", "y", "enabled", "-1", "1.0"])
def test_boolean_knobs_reject_other_words(key, raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({key: raw})
    _assert_names_variable_and_value(excinfo, key, raw)


def test_first_bad_variable_is_reported_even_with_good_ones():
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({FUSION: "1024", CYCLE: "2", CACHE: "lots"})
    _assert_names_variable_and_value(excinfo, CACHE, "lots")


def test_error_mentions_default():
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({CACHE: "x"})
    assert str(EngineConfig().cache_capacity) in str(excinfo.value)


# ---- upper bounds ---------------------------------------------------------------
# The engine takes the cache capacity as a C int and the fusion threshold as an
# int64, and waits with std::chrono: values past the bounds are rejected
# instead of wrapping or overflowing there.


@pytest.mark.parametrize(
    "key, raw",
    [(CACHE, str(2**31)), (CACHE, str(2**32 + 5)), (FUSION, str(2**63))],
)
def test_out_of_range_integers_rejected(key, raw):
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({key: raw})
    _assert_names_variable_and_value(excinfo, key, raw)


@pytest.mark.parametrize("raw", ["inf", "Infinity", "1e400"])
def test_infinite_cycle_time_rejected(raw):
    assert math.isinf(float(raw))
    with pytest.raises(ValueError) as excinfo:
        engine_config_from_env({CYCLE: raw})
    _assert_names_variable_and_value(excinfo, CYCLE, raw)


# --- Horovod's names for the knobs ---------------------------------------------

def test_horovod_names_are_read_when_ours_are_unset():
    cfg = engine_config_from_env({
        "HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "3.5",
        "HOROVOD_CACHE_CAPACITY": "7", "HOROVOD_STALL_CHECK_TIME_SECONDS": "11",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "22", "HOROVOD_TIMELINE": "/tmp/t.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "1", "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": "/tmp/a.csv", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    assert cfg.hierarchical_allreduce == "on"
    assert (cfg.fusion_threshold, cfg.cycle_time_ms, cfg.cache_capacity) == (1048576, 3.5, 7)
    assert (cfg.stall_check_seconds, cfg.stall_shutdown_seconds) == (11.0, 22.0)
    assert (cfg.timeline_path, cfg.timeline_mark_cycles) == ("/tmp/t.json", True)
    assert (cfg.autotune, cfg.autotune_log) == (True, "/tmp/a.csv")
    assert cfg.fusion_threshold_fixed and cfg.cycle_time_fixed
    assert engine_config_from_env({"HOROVOD_STALL_CHECK_DISABLE": "1"}).stall_check_seconds == 0.0
    # Every engine knob with a Horovod name maps to one of ours.
    assert set(config.HOROVOD_ALIASES.values()) <= {
        FUSION, CYCLE, CACHE, STALL_CHECK, config.STALL_CHECK_DISABLE, STALL_SHUTDOWN,
        config.TIMELINE, config.TIMELINE_MARK_CYCLES, config.AUTOTUNE, config.AUTOTUNE_LOG,
        config.HIERARCHICAL_ALLREDUCE}


@pytest.mark.parametrize("raw, value", [("", "auto"), ("auto", "auto"), ("AUTO", "auto"),
                                        ("1", "on"), ("on", "on"), ("0", "off"),
                                        ("false", "off")])
def test_hierarchical_allreduce_reads_auto_or_a_boolean(raw, value):
    cfg = engine_config_from_env({config.HIERARCHICAL_ALLREDUCE: raw})
    assert cfg.hierarchical_allreduce == value


def test_hierarchical_allreduce_refuses_other_values_and_needs_shared_memory():
    with pytest.raises(ValueError, match=r"HVDKERAS_HIERARCHICAL_ALLREDUCE='tree': use auto"):
        engine_config_from_env({config.HIERARCHICAL_ALLREDUCE: "tree"})
    with pytest.raises(ValueError, match=r"needs the shared-memory allreduce.*"
                                         r"HVDKERAS_SHM_ALLREDUCE=0"):
        engine_config_from_env({config.HIERARCHICAL_ALLREDUCE: "1", config.SHM_ALLREDUCE: "0"})
    # Off needs nothing.
    assert engine_config_from_env({config.HIERARCHICAL_ALLREDUCE: "0",
                                   config.SHM_ALLREDUCE: "0"}).hierarchical_allreduce == "off"


def test_ours_win_over_horovods_and_say_so():
    env = {"HOROVOD_CYCLE_TIME": "5", CYCLE: "2", "HOROVOD_FUSION_THRESHOLD": "8", FUSION: "8"}
    assert engine_config_from_env(env).cycle_time_ms == 2.0
    assert config.ignored_horovod_aliases(env) == [
        "HOROVOD_CYCLE_TIME='5' is ignored: HVDKERAS_CYCLE_TIME='2' is set"]


def test_a_bad_horovod_value_is_named_as_set():
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME='x' is not a number"):
        engine_config_from_env({"HOROVOD_CYCLE_TIME": "x"})


def test_the_graph_pass_reads_the_variable_config_names():
    """ops/tf/separate_allreduces.cc reads its switch itself (TensorFlow runs the
    pass, not init()); the name must be the one config.py and the docs give."""
    source = (Path(__file__).resolve().parents[1] / "ops" / "tf" /
              "separate_allreduces.cc").read_text()
    assert f'"{config.MERGE_SEPARATE_ALLREDUCES}"' in source


def test_stage_three_knobs_parsed_and_bad_values_named():
    assert config.zero3_prefetch({}) is False
    assert config.zero3_prefetch({"HVDKERAS_ZERO3_PREFETCH": "1"}) is True
    assert config.zero3_group_bytes(32 << 20, {}) == 32 << 20
    assert config.zero3_group_bytes(32 << 20, {"HVDKERAS_ZERO3_GROUP_BYTES": "4096"}) == 4096
    for bad in ("0", "-5", "4k"):
        with pytest.raises(ValueError, match="HVDKERAS_ZERO3_GROUP_BYTES"):
            config.zero3_group_bytes(32 << 20, {"HVDKERAS_ZERO3_GROUP_BYTES": bad})
