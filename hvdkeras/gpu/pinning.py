"""Which GPU a process uses: pure rules, tested without GPUs or MPI.

`CUDA_VISIBLE_DEVICES` is read the way CUDA reads it: a comma-separated list
of ordinals or UUIDs ("GPU-..." / "MIG-..."), cut at the first entry that is
not valid; unset means every GPU. Each process then takes one of the GPUs it
sees, chosen by its local rank, unless the ranks of a host were already given
different GPU sets (by a scheduler, say), in which case each keeps the first
of its own.

What may import this module: `hvdkeras.gpu`.
"""

from __future__ import annotations

from typing import Optional, Sequence


class PinningError(ValueError):
    """The GPUs this host shows cannot be shared out one per process."""


def parse_visible_devices(value: Optional[str], physical_count: int) -> list[str]:
    """The GPUs that `CUDA_VISIBLE_DEVICES=value` shows, in CUDA's order.

    Args:
        value: the variable's value, or None when it is unset.
        physical_count: how many GPUs the machine has.

    Returns:
        The visible entries, as CUDA will number them (0, 1, ...): physical
        ordinals as text, or the UUIDs given.

    Example:
    >>> parse_visible_devices("2,0,7,1", 4)
    ['2', '0']
    """
    if value is None:
        return [str(i) for i in range(physical_count)]
    visible: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            if entry in visible:
                break
            visible.append(entry)
            continue
        if not entry.isdigit() or int(entry) >= physical_count or str(int(entry)) in visible:
            break  # CUDA stops at the first entry it cannot use
        visible.append(str(int(entry)))
    return visible


def choose_gpu(local_rank: int, local_size: int, visible_count: int,
               local_settings: Sequence[Optional[str]]) -> int:
    """The index (among the visible GPUs) this process should use.

    Args:
        local_rank: this process's rank on its host.
        local_size: how many processes run on its host.
        visible_count: how many GPUs this process sees.
        local_settings: `CUDA_VISIBLE_DEVICES` of every process on the host
            (None where unset), by local rank.

    Returns:
        The visible GPU to use.

    Raises:
        PinningError: when the host has fewer GPUs than processes.

    Example:
    >>> choose_gpu(1, 2, 2, [None, None])
    1
    """
    if visible_count == 0:
        raise PinningError("no GPU is visible to this process"
                           + _describe_setting(local_settings[local_rank]))
    if len(set(local_settings)) > 1:
        # Each process was given its own GPUs: keep the first of them.
        return 0
    if local_rank >= visible_count:
        raise PinningError(
            f"this host runs {local_size} processes but shows only {visible_count} "
            f"GPU{'s' if visible_count != 1 else ''}"
            + _describe_setting(local_settings[local_rank])
            + f": run at most {visible_count} processes per host, or make more GPUs visible")
    return local_rank


def _describe_setting(value: Optional[str]) -> str:
    return f" (CUDA_VISIBLE_DEVICES={value!r})" if value is not None else ""
