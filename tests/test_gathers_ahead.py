"""The order in which stage 3 starts gathers ahead of their reads (pure
logic, no MPI; Note [gathers started ahead] in hvdkeras/sharding/gathers_ahead.py)."""

from hvdkeras.sharding.gathers_ahead import GathersAhead


def _pass(ahead, what, groups):
    """Reads `groups` in order as a pass does; returns what each read started."""
    started = []
    for group in groups:
        ahead.take(what, group)
        following = ahead.read(what, group)
        if following is not None:
            ahead.start(what, following, f"gather {following}")
        started.append(following)
    return started


def test_the_first_pass_learns_the_order_and_later_passes_start_one_group_ahead():
    dropped = []
    ahead = GathersAhead(True, dropped.append)
    assert _pass(ahead, "params", [0, 2, 5]) == [None, None, None]
    ahead.drop_all()
    assert _pass(ahead, "params", [0, 2, 5]) == [2, 5, None]  # no wrap to 0
    assert ahead.used == 2 and not ahead.started and dropped == []


def test_each_kind_of_gather_keeps_its_own_order():
    ahead = GathersAhead(True, lambda started: None)
    _pass(ahead, "params", [0, 1, 2])
    _pass(ahead, "regather", [2, 0])
    ahead.drop_all()
    assert _pass(ahead, "params", [0, 1, 2]) == [1, 2, None]
    assert _pass(ahead, "regather", [2, 0]) == [0, None]


def test_a_group_is_started_ahead_at_most_once_between_changes():
    ahead = GathersAhead(True, lambda started: None)
    _pass(ahead, "params", [0, 1, 0, 2])  # a shared layer reads group 0 twice
    assert ahead.next_of["params"] == {0: 1, 1: 2}
    ahead.drop_all()
    assert _pass(ahead, "params", [0, 1, 0, 2]) == [1, 2, None, None]
    # A second pass before the weights change (evaluation) starts nothing.
    assert _pass(ahead, "params", [0, 1, 2]) == [None, None, None]


def test_what_no_read_took_is_dropped_before_the_weights_change():
    dropped = []
    ahead = GathersAhead(True, dropped.append)
    _pass(ahead, "params", [0, 1, 2])
    ahead.drop_all()
    assert _pass(ahead, "params", [0]) == [1]  # a pass that stops early
    ahead.drop_all()
    assert dropped == ["gather 1"] and not ahead.started and ahead.used == 0


def test_switched_off_it_learns_but_starts_nothing():
    ahead = GathersAhead(False, lambda started: None)
    _pass(ahead, "params", [0, 1])
    ahead.drop_all()
    assert _pass(ahead, "params", [0, 1]) == [None, None]
    assert ahead.next_of == {"params": {0: 1}}
