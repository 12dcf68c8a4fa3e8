"""When and after how long `hvdkerasrun --max-restarts K` relaunches a job. Pure."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Relaunch the whole job after a failure, up to `max_restarts` times.

    Attributes:
        max_restarts: Relaunches allowed after the first attempt (0: none).
        backoff_s: Wait before the first relaunch; doubles each time.
        max_backoff_s: Upper bound of the wait.
    """

    max_restarts: int = 0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def __post_init__(self):
        if not isinstance(self.max_restarts, int) or isinstance(self.max_restarts, bool) \
                or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be a whole number >= 0, got {self.max_restarts!r}.")
        if not self.backoff_s >= 0 or not self.max_backoff_s >= 0:
            raise ValueError("restart backoff must be >= 0 seconds.")

    @property
    def max_attempts(self) -> int:
        return self.max_restarts + 1

    def should_restart(self, attempt: int, exit_code: int, interrupted: bool = False) -> bool:
        """Whether to relaunch after attempt number `attempt` (1-based) ended with `exit_code`.

        A successful job, a job the user interrupted (Ctrl-C, SIGTERM to the
        launcher) and the last allowed attempt are never relaunched.

        >>> RestartPolicy(2).should_restart(1, 3)
        True
        >>> RestartPolicy(2).should_restart(3, 3)
        False
        """
        return exit_code != 0 and not interrupted and attempt < self.max_attempts

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before relaunching after attempt `attempt` (1-based) failed."""
        return min(self.backoff_s * (2 ** max(attempt - 1, 0)), self.max_backoff_s)
