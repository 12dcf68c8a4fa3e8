"""A first look at hvdkeras collectives.

Run it on two (or more) processes:

    mpiexec -n 2 python examples/allreduce_demo.py

or on one (a world of size 1) with plain `python examples/allreduce_demo.py`.

Every rank runs this same script. Rank r contributes the tensor
(r + 1) * [1, 2, 3], so the results depend on how many ranks there are.
Each hvd.* call below is a collective: every rank must make the same calls,
in the same order, under the same names. Rank 0 prints a table of what came
back next to what was expected; the script exits with status 1 if any rank
saw a wrong value.
"""

import os
import sys

# Keep TensorFlow's start-up logging out of the way (set before importing TF).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdkeras as hvd  # noqa: E402


def main() -> int:
    # 1. Start hvdkeras on every rank (builds the op library on first use).
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    # 2. A rank-dependent tensor: rank r holds (r + 1) * [1, 2, 3].
    x = tf.constant([1.0, 2.0, 3.0]) * float(rank + 1)
    ranks_total = size * (size + 1) / 2  # 1 + 2 + ... + size

    # 3. Allreduce: every rank gets the element-wise sum / average over ranks.
    #    Ranks match collectives by name, so give each call its own name.
    summed = hvd.allreduce(x, op=hvd.Sum, name="demo.sum")
    averaged = hvd.allreduce(x, op=hvd.Average, name="demo.average")

    # 4. Grouped allreduce: several tensors (any shapes) negotiated together
    #    and reduced in one fused buffer.
    group = hvd.grouped_allreduce(
        [tf.fill([2], float(rank)), tf.ones([2, 2]) * float(rank + 1)],
        op=hvd.Sum, name="demo.grouped")

    # 5. Allgather: the ranks' tensors concatenated along the first dimension,
    #    which may differ per rank. Rank r sends r + 1 copies of the value r.
    gathered = hvd.allgather(tf.fill([rank + 1], rank), name="demo.allgather")

    # 6. Broadcast: every rank receives rank 0's tensor (e.g. a random seed
    #    or initial weights), whatever it held itself.
    mine = tf.constant([100 * rank + 7, 100 * rank + 8], dtype=tf.int32)
    from_root = hvd.broadcast(mine, root_rank=0, name="demo.broadcast")

    # 7. Inside a tf.function the same call becomes a graph op; hvdkeras
    #    names it after the graph node, identical on every rank.
    @tf.function
    def doubled_sum(t):
        return hvd.allreduce(2.0 * t, op=hvd.Sum, name="demo.in_graph")

    in_graph = doubled_sum(x)

    # 8. Compare every result with what the arithmetic says it must be.
    base = np.array([1.0, 2.0, 3.0])
    rows = [
        ("allreduce Sum", summed, base * ranks_total),
        ("allreduce Average", averaged, base * ranks_total / size),
        ("grouped_allreduce [0]", group[0], np.full([2], size * (size - 1) / 2)),
        ("grouped_allreduce [1]", group[1], np.full([2, 2], ranks_total)),
        ("allgather", gathered, np.concatenate([np.full([r + 1], r) for r in range(size)])),
        ("broadcast from rank 0", from_root, np.array([7, 8])),
        ("allreduce in tf.function", in_graph, 2 * base * ranks_total),
    ]
    results = []
    for label, got, want in rows:
        got = np.asarray(got)
        ok = got.shape == want.shape and np.allclose(got, want)
        results.append((label, got, want, ok))
    wrong_here = sum(not ok for *_, ok in results)

    # 9. One more allreduce tells rank 0 whether any rank saw a wrong value.
    wrong_anywhere = int(hvd.allreduce(tf.constant(wrong_here), op=hvd.Sum, name="demo.check"))

    if rank == 0:
        print(f"hvdkeras demo on {size} rank(s); rank r contributes (r + 1) * [1, 2, 3]\n")
        print(f"{'operation':<26} {'result':<26} {'expected':<26} check")
        print("-" * 85)
        for label, got, want, ok in results:
            print(f"{label:<26} {_fmt(got):<26} {_fmt(want):<26} {'ok' if ok else 'WRONG'}")
        print()
        print("OK: every value is correct on every rank" if wrong_anywhere == 0 else
              f"FAILED: {wrong_anywhere} wrong value(s) across the ranks")

    # 10. Stop the engine on every rank.
    hvd.shutdown()
    return 0 if wrong_anywhere == 0 else 1


def _fmt(value: np.ndarray) -> str:
    """A short one-line rendering of a small array: "[1, 2, 3]" or "[...] (2x2)"."""
    value = np.asarray(value)
    text = "[" + ", ".join(f"{v:g}" for v in value.ravel()) + "]"
    if value.ndim > 1:
        text += " (" + "x".join(map(str, value.shape)) + ")"
    return text


if __name__ == "__main__":
    sys.exit(main())
