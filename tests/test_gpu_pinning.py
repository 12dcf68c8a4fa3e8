"""The GPU pinning rules (hvdkeras.gpu.pinning): pure, no GPU or MPI needed.
`pin_gpu()` itself runs in tests/parallel (no GPU: it does nothing) and in
tests/gpu."""

from __future__ import annotations

import pytest

from hvdkeras.gpu.pinning import PinningError, choose_gpu, parse_visible_devices


@pytest.mark.parametrize("value, count, expected", [
    (None, 4, ["0", "1", "2", "3"]),
    (None, 0, []),
    ("", 4, []),
    ("2", 4, ["2"]),
    ("3,1", 4, ["3", "1"]),
    (" 1 , 0 ", 4, ["1", "0"]),
    ("01", 4, ["1"]),
    # CUDA stops at the first entry it cannot use.
    ("2,0,7,1", 4, ["2", "0"]),
    ("-1", 4, []),
    ("0,-1,1", 4, ["0"]),
    ("1,1,2", 4, ["1"]),
    ("0,abc,1", 4, ["0"]),
    ("GPU-8a1f,GPU-77c0", 2, ["GPU-8a1f", "GPU-77c0"]),
    ("MIG-4e2b,0", 1, ["MIG-4e2b", "0"]),
    ("GPU-8a1f,GPU-8a1f", 2, ["GPU-8a1f"]),
])
def test_visible_devices_are_read_as_cuda_reads_them(value, count, expected):
    assert parse_visible_devices(value, count) == expected


def test_local_rank_picks_among_the_visible_gpus():
    assert [choose_gpu(r, 4, 4, [None] * 4) for r in range(4)] == [0, 1, 2, 3]
    assert [choose_gpu(r, 2, 2, ["3,1"] * 2) for r in range(2)] == [0, 1]
    assert choose_gpu(0, 1, 8, [None]) == 0


def test_ranks_given_their_own_gpus_keep_them():
    # A scheduler set a different CUDA_VISIBLE_DEVICES per process.
    settings = ["0", "1", "2"]
    assert [choose_gpu(r, 3, 1, settings) for r in range(3)] == [0, 0, 0]


def test_too_few_gpus_is_an_error_naming_the_numbers():
    with pytest.raises(PinningError) as error:
        choose_gpu(2, 3, 2, [None] * 3)
    assert str(error.value) == ("this host runs 3 processes but shows only 2 GPUs: run at most "
                                "2 processes per host, or make more GPUs visible")
    with pytest.raises(PinningError, match=r"shows only 1 GPU \(CUDA_VISIBLE_DEVICES='0'\)"):
        choose_gpu(1, 2, 1, ["0", "0"])


def test_no_visible_gpu_is_an_error():
    with pytest.raises(PinningError, match=r"no GPU is visible to this process "
                                           r"\(CUDA_VISIBLE_DEVICES=''\)"):
        choose_gpu(0, 2, 0, ["", "0"])
