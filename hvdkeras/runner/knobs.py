"""Launcher flags -> the engine's ``HVDKERAS_*`` environment variables.

Pure functions. The values are validated with the same rules the engine
applies at `hvdkeras.init()` (`hvdkeras.engine.config`), so a bad value fails in the
launcher, before any rank starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

from hvdkeras.engine import config

LOG_LEVEL = config.LOG_LEVEL
# --log-level -> TF_CPP_MIN_LOG_LEVEL (0 shows everything, 3 only fatal errors).
LOG_LEVELS = {"trace": "0", "debug": "0", "info": "0", "warning": "1", "error": "2", "fatal": "3"}


@dataclasses.dataclass
class Knobs:
    """The engine settings `hvdkerasrun` accepts; None means "engine default"."""

    fusion_threshold_mb: Optional[float] = None
    cycle_time_ms: Optional[float] = None
    cache_capacity: Optional[int] = None
    timeline_filename: Optional[str] = None
    timeline_mark_cycles: bool = False
    autotune: bool = False
    autotune_log_file: Optional[str] = None
    stall_check_seconds: Optional[float] = None
    no_stall_check: bool = False
    stall_shutdown_seconds: Optional[float] = None
    liveness_seconds: Optional[float] = None
    log_level: Optional[str] = None


def _number(text: float) -> str:
    """Shortest faithful text for a float knob (``2.0`` -> ``2``)."""
    value = float(text)
    return str(int(value)) if value.is_integer() else repr(value)


def knob_env(knobs: Knobs, cwd: Optional[str] = None) -> dict[str, str]:
    """Environment variables for `knobs`; raises ValueError for bad values.

    File names are made absolute against `cwd` (default: the current directory),
    so every rank writes where the user expects whatever its working directory.

    >>> knob_env(Knobs(fusion_threshold_mb=2, cycle_time_ms=5))
    {'HVDKERAS_FUSION_THRESHOLD': '2097152', 'HVDKERAS_CYCLE_TIME': '5'}
    """
    cwd = cwd or os.getcwd()
    env: dict[str, str] = {}
    if knobs.fusion_threshold_mb is not None:
        mb = float(knobs.fusion_threshold_mb)
        if not (math.isfinite(mb) and mb >= 0):
            raise ValueError(f"--fusion-threshold-mb must be a number of MiB >= 0, got {mb:g}.")
        env[config.FUSION_THRESHOLD] = str(int(round(mb * 1024 * 1024)))
    if knobs.cycle_time_ms is not None:
        env[config.CYCLE_TIME] = _number(knobs.cycle_time_ms)
    if knobs.cache_capacity is not None:
        env[config.CACHE_CAPACITY] = str(int(knobs.cache_capacity))
    if knobs.timeline_filename:
        env[config.TIMELINE] = os.path.join(cwd, knobs.timeline_filename)
    if knobs.timeline_mark_cycles:
        env[config.TIMELINE_MARK_CYCLES] = "1"
    if knobs.autotune:
        env[config.AUTOTUNE] = "1"
    if knobs.autotune_log_file:
        if not knobs.autotune:
            raise ValueError("--autotune-log-file needs --autotune.")
        env[config.AUTOTUNE_LOG] = os.path.join(cwd, knobs.autotune_log_file)
    if knobs.stall_check_seconds is not None:
        env[config.STALL_CHECK_SECONDS] = _number(knobs.stall_check_seconds)
    if knobs.no_stall_check:
        env[config.STALL_CHECK_DISABLE] = "1"
    if knobs.stall_shutdown_seconds is not None:
        env[config.STALL_SHUTDOWN_SECONDS] = _number(knobs.stall_shutdown_seconds)
    if knobs.liveness_seconds is not None:
        env[config.LIVENESS_SECONDS] = _number(knobs.liveness_seconds)
    if knobs.log_level is not None:
        level = knobs.log_level.lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}; got {knobs.log_level!r}.")
        env[LOG_LEVEL] = level
        env["TF_CPP_MIN_LOG_LEVEL"] = LOG_LEVELS[level]
    # Same checks as the engine applies at init (bounds, types).
    config.engine_config_from_env(env)
    return env
