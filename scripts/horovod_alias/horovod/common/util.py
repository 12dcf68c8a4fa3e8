"""Stand-in for horovod.common.util's version helper (used by Horovod's tests)."""
from packaging import version


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    return version.parse(ver) >= version.parse(target)
