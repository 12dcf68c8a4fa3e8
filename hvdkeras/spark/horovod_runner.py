"""HorovodRunner's front end, `Runner(np).run(fn, **kwargs)`: Spark tasks or local processes.

What may import this module: the top-level package (`hvdkeras.Runner`).
It needs pyspark only when it runs on Spark.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Tuple

from hvdkeras.runner.function_runner import run
from hvdkeras.spark.runner import run as spark_run


DRIVER_LOG_VERBOSITIES = ("all", "log_callback_only")


def runner_placement(np: int, spark_active: bool) -> Tuple[str, int]:
    """("spark" or "local", ranks) for HorovodRunner's `np`. Pure.

    HorovodRunner's rule: np > 0 runs np ranks as Spark tasks, np < 0 runs
    -np local processes on the driver. Without an active SparkContext a
    positive np runs local processes too (there is no cluster to use).
    """
    if isinstance(np, bool) or not isinstance(np, int) or np == 0:
        raise ValueError(f"np must be a non-zero whole number (> 0: Spark tasks, < 0: local "
                         f"processes on this machine), got {np!r}.")
    if np < 0:
        return "local", -np
    return ("spark" if spark_active else "local"), np


class Runner:
    """HorovodRunner's front end: ``Runner(np).run(fn, **kwargs)`` returns rank 0's result.

    Args:
        np: > 0: that many ranks as Spark tasks when a SparkContext is active
            (HorovodRunner on a cluster), else local processes; < 0: -np
            local processes on this machine (HorovodRunner's local mode).
        driver_log_verbosity: HorovodRunner's "all" or "log_callback_only";
            hvdkeras streams every rank's output with a rank prefix either way.
        **options: Passed on to `hvdkeras.run` (local) or
            `hvdkeras.spark.run` (Spark): e.g. `env`, `timeout`.

    Example:

    ```python
    hr = hvdkeras.Runner(np=-2)            # two local processes
    result = hr.run(train, learning_rate=0.1)
    ```
    """

    def __init__(self, np: int = 2, driver_log_verbosity: str = "all", **options: Any) -> None:
        runner_placement(np, spark_active=False)  # checks np
        if driver_log_verbosity not in DRIVER_LOG_VERBOSITIES:
            raise ValueError(f"driver_log_verbosity must be one of {DRIVER_LOG_VERBOSITIES}, "
                             f"got {driver_log_verbosity!r}.")
        self.np = np
        self.driver_log_verbosity = driver_log_verbosity
        self.options = options

    def run(self, fn: Callable, **kwargs: Any) -> Any:
        """Runs ``fn(**kwargs)`` on the ranks; returns rank 0's result."""
        where, ranks = runner_placement(self.np, _spark_context_active())
        if where == "spark":
            return spark_run(fn, kwargs=kwargs, num_proc=ranks, **self.options)[0]
        return run(fn, kwargs=kwargs, np=ranks, return_all=False, **self.options)


def _spark_context_active() -> bool:
    """Whether pyspark is imported in this process with an active SparkContext."""
    pyspark = sys.modules.get("pyspark")
    context = getattr(pyspark, "SparkContext", None) if pyspark else None
    return getattr(context, "_active_spark_context", None) is not None
