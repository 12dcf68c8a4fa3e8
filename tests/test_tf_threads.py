"""The thread-sharing policy of `hvdkeras.engine.tf_threads`, without MPI or TensorFlow."""

from __future__ import annotations

import pytest

from hvdkeras.engine import tf_threads
from hvdkeras.engine.tf_threads import (AUTO, OFF, TF_THREADS, parse_setting, sharing_ranks,
                                 threads_per_rank)


@pytest.mark.parametrize("raw", [None, "", "  ", "auto", "AUTO", " Auto "])
def test_unset_or_auto_means_share(raw):
    env = {} if raw is None else {TF_THREADS: raw}
    assert parse_setting(env) == AUTO


@pytest.mark.parametrize("raw", ["0", "off", "OFF", " off "])
def test_zero_or_off_leaves_tensorflow_alone(raw):
    assert parse_setting({TF_THREADS: raw}) == OFF


@pytest.mark.parametrize("raw, expected", [("1", 1), ("4", 4), (" 12 ", 12)])
def test_positive_number_is_taken(raw, expected):
    assert parse_setting({TF_THREADS: raw}) == expected


@pytest.mark.parametrize("raw", ["-1", "-3", "two", "1.5", "4x", "on"])
def test_bad_values_name_the_knob_and_the_choices(raw):
    with pytest.raises(ValueError) as excinfo:
        parse_setting({TF_THREADS: raw})
    message = str(excinfo.value)
    assert TF_THREADS in message and repr(raw.strip().lower()) in message
    assert "'auto'" in message and "'off'" in message and "positive number" in message


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv(TF_THREADS, "3")
    assert parse_setting() == 3
    monkeypatch.delenv(TF_THREADS)
    assert parse_setting() == AUTO


def test_ranks_sharing_all_cores_split_them():
    cores = list(range(8))
    assert threads_per_rank(cores, [cores] * 2) == 4
    assert threads_per_rank(cores, [cores] * 3) == 2  # 8 // 3, rounded down
    assert threads_per_rank(cores, [cores] * 8) == 1


def test_a_lone_rank_keeps_every_core():
    cores = list(range(6))
    assert threads_per_rank(cores, [cores]) == 6


def test_never_fewer_than_one_thread():
    assert threads_per_rank([0, 1], [[0, 1]] * 3) == 1
    assert threads_per_rank([0], [[0]] * 4) == 1


def test_ranks_bound_to_their_own_cores_keep_them():
    """A launcher that pins each rank to disjoint cores leaves nothing to share."""
    sets = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert threads_per_rank(sets[0], sets) == 4
    assert threads_per_rank(sets[1], sets) == 4


def test_only_overlapping_ranks_count():
    """Two ranks share cores 0-3, a third is pinned to 4-7."""
    sets = [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert threads_per_rank(sets[0], sets) == 2
    assert threads_per_rank(sets[2], sets) == 4


def test_sharing_ranks_counts_overlapping_cpu_sets():
    """Who competes for this rank's cores decides whether idle pool threads may spin."""
    shared = [[0, 1], [0, 1], [0, 1]]
    assert sharing_ranks(shared[0], shared) == 3
    pinned = [[0, 1], [2, 3]]
    assert sharing_ranks(pinned[0], pinned) == 1
    partly = [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert sharing_ranks(partly[0], partly) == 2
    assert sharing_ranks(partly[2], partly) == 1
    assert sharing_ranks([0], [[0]]) == 1  # a lone rank
    assert sharing_ranks([0], []) == 1  # never fewer than itself


def test_allowed_cpus_lists_this_process():
    cpus = tf_threads.allowed_cpus()
    assert cpus and cpus == sorted(set(cpus))
