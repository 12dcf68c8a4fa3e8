"""Engine knobs read from the environment, validated before the engine starts.

Pure functions: nothing here touches MPI or TensorFlow, so the parsing rules
are unit-tested directly.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

FUSION_THRESHOLD = "HVDKERAS_FUSION_THRESHOLD"
CYCLE_TIME = "HVDKERAS_CYCLE_TIME"
CACHE_CAPACITY = "HVDKERAS_CACHE_CAPACITY"


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Settings of the background engine.

    Attributes:
        fusion_threshold: Largest fused buffer in bytes (0 disables fusion).
        cycle_time_ms: How long an idle rank waits between negotiation ticks,
            in milliseconds. Ranks with new work start a cycle at once.
        cache_capacity: Entries in the response cache behind the fast
            negotiation path (0 sends every request to the coordinator).
    """

    fusion_threshold: int = 64 * 1024 * 1024
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024


def _parse_int(env: Mapping[str, str], key: str, default: int, minimum: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(
            f"{key}={raw!r} is not a whole number; set it to an integer >= {minimum} "
            f"or unset it to use the default ({default})."
        ) from None
    if value < minimum:
        raise ValueError(f"{key}={raw!r} must be >= {minimum} (default {default}).")
    return value


def _parse_float(env: Mapping[str, str], key: str, default: float, minimum: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{key}={raw!r} is not a number; set it to a value > {minimum} "
            f"or unset it to use the default ({default})."
        ) from None
    if not value > minimum or value != value:
        raise ValueError(f"{key}={raw!r} must be a number > {minimum} (default {default}).")
    return value


def engine_config_from_env(env: Optional[Mapping[str, str]] = None) -> EngineConfig:
    """Reads the engine knobs from `env` (default: `os.environ`).

    Args:
        env: A mapping of environment variables.

    Returns:
        The validated `EngineConfig`.

    Raises:
        ValueError: naming the variable, its value and what is allowed.

    Example:

    >>> engine_config_from_env({"HVDKERAS_CYCLE_TIME": "2.5"}).cycle_time_ms
    2.5
    """
    env = os.environ if env is None else env
    defaults = EngineConfig()
    return EngineConfig(
        fusion_threshold=_parse_int(env, FUSION_THRESHOLD, defaults.fusion_threshold, 0),
        cycle_time_ms=_parse_float(env, CYCLE_TIME, defaults.cycle_time_ms, 0.0),
        cache_capacity=_parse_int(env, CACHE_CAPACITY, defaults.cache_capacity, 0),
    )
