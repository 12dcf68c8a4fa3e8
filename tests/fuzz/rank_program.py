"""One rank of a divergence-fuzzer job: runs programs, records what happened.

    mpiexec -n N python tests/fuzz/rank_program.py OUT_DIR PROGRAM [PROGRAM ...]

where each PROGRAM is SEED (a random divergence, or none) or SEED:KIND (KIND
one of programs.DIVERGENCES, or "none").

Every rank derives each program from its seed (`programs.make_program`) and
runs its own actions: the collective steps in their mode (eager,
`tf.function`, or a `tf.compat.v1` graph in a session), with exact checks of
every result while no rank has diverged yet. A step that fails ends the
program on that rank; an exception raised on purpose ("raise") is caught and
the rank goes on. After each program the ranks meet in a resync allreduce
(retried while it stalls), which also proves the engine still works.
Each rank appends one JSON line per program to OUT_DIR/rank<r>.jsonl.

Environment: FUZZ_SLEEP_SECONDS (how long a "sleep" divergence sleeps).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

import hvdkeras as hvd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import programs  # noqa: E402  (this folder is not a package)

SYNC_ATTEMPTS = 5


class RaisedOnPurpose(RuntimeError):
    pass


def _dtype(name: str) -> tf.DType:
    return tf.as_dtype(name)


def _full(rows: int, cols: int, value: float, dtype: str) -> np.ndarray:
    return np.full([rows, cols], value, dtype=dtype)


class Runner:
    def __init__(self, rank: int, size: int, process_set: Optional[Any]):
        self.rank, self.size, self.process_set = rank, size, process_set

    # Each kind: (inputs of this rank, the call on tensors, the expected result).
    def build(self, kind: str, step: programs.Step, name: str, dtype: str, cols: int):
        r, n, k = self.rank, self.size, step.index
        root = k % n
        value = r + 1 + k
        total = sum(q + 1 + k for q in range(n))
        if kind == "allreduce":
            x = _full(2, cols, value, dtype)
            return [x], lambda t: [hvd.allreduce(t[0], op=hvd.Sum, name=name)], [
                _full(2, cols, total, dtype)]
        if kind == "set_allreduce":
            members = programs.set_ranks(n)
            x = _full(2, cols, value, dtype)
            return [x], lambda t: [hvd.allreduce(t[0], op=hvd.Sum, name=name,
                                                 process_set=self.process_set)], [
                _full(2, cols, sum(q + 1 + k for q in members), dtype)]
        if kind == "grouped_allreduce":
            x = _full(2, cols, value, dtype)
            return [x, 2 * x], lambda t: hvd.grouped_allreduce(t, op=hvd.Sum, name=name), [
                _full(2, cols, total, dtype), _full(2, cols, 2 * total, dtype)]
        if kind == "sparse_allreduce":
            x = _full(2, cols, value, dtype)

            def sparse(t):
                s = tf.IndexedSlices(t[0], tf.constant([r, r + 1], tf.int64),
                                     dense_shape=tf.constant([n + 1, cols], tf.int64))
                out = hvd.allreduce(s, op=hvd.Sum, name=name)
                return [out.values, out.indices]
            rows = np.concatenate([_full(2, cols, q + 1 + k, dtype) for q in range(n)])
            indices = np.array([i for q in range(n) for i in (q, q + 1)], np.int64)
            return [x], sparse, [rows, indices]
        if kind == "allgather":
            x = _full(r + 1, cols, value, dtype)
            return [x], lambda t: [hvd.allgather(t[0], name=name)], [
                np.concatenate([_full(q + 1, cols, q + 1 + k, dtype) for q in range(n)])]
        if kind == "grouped_allgather":
            x = _full(r + 1, cols, value, dtype)
            return [x, 2 * x], lambda t: hvd.grouped_allgather(t, name=name), [
                np.concatenate([_full(q + 1, cols, q + 1 + k, dtype) for q in range(n)]),
                np.concatenate([_full(q + 1, cols, 2 * (q + 1 + k), dtype) for q in range(n)])]
        if kind == "broadcast":
            x = _full(2, cols, value, dtype)
            return [x], lambda t: [hvd.broadcast(t[0], root_rank=root, name=name)], [
                _full(2, cols, root + 1 + k, dtype)]
        if kind == "alltoall":
            x = np.array([[r * 10 + d + k] * cols for d in range(n)], dtype=dtype)

            def alltoall(t):
                out, _ = hvd.alltoall(t[0], splits=[1] * n, name=name)
                return [out]
            return [x], alltoall, [
                np.array([[s * 10 + r + k] * cols for s in range(n)], dtype=dtype)]
        if kind == "reducescatter":
            x = _full(2 * n, cols, value, dtype)
            return [x], lambda t: [hvd.reducescatter(t[0], op=hvd.Sum, name=name)], [
                _full(2, cols, total, dtype)]
        raise ValueError(kind)

    def run_tensors(self, mode: str, inputs: List[np.ndarray], call: Callable):
        if mode == "eager":
            return [t.numpy() for t in call([tf.constant(x) for x in inputs])]
        if mode == "function":
            fn = tf.function(lambda *t: call(list(t)))
            return [t.numpy() for t in fn(*[tf.constant(x) for x in inputs])]
        graph = tf.Graph()
        with graph.as_default():
            outputs = call([tf.constant(x) for x in inputs])
            with tf.compat.v1.Session(graph=graph) as session:
                return list(session.run(outputs))

    def run_eager_kind(self, kind: str, step: programs.Step, name: str):
        k, n = step.index, self.size
        root = k % n
        if kind == "barrier":
            hvd.barrier(name=name)
            return None, None
        if kind == "broadcast_object":
            got = hvd.broadcast_object({"k": k, "r": self.rank}, root_rank=root, name=name)
            return got, {"k": k, "r": root}
        if kind == "allgather_object":
            got = hvd.allgather_object((self.rank, k), name=name)
            return got, [(q, k) for q in range(n)]
        raise ValueError(kind)

    def run_action(self, seed: int, action: programs.Action) -> Dict[str, Any]:
        step = action.step
        kind = action.kind or step.kind
        name = step.name(seed) + action.name_suffix
        record = {"i": step.index, "kind": kind, "mode": step.mode}
        members = programs.set_ranks(self.size)
        if kind == "set_allreduce" and self.rank not in members:
            record["skipped"] = "not a member"
            return record
        if action.what == "raise":
            raise RaisedOnPurpose(f"raised on purpose before {name}")
        if kind in programs.EAGER_KINDS:
            got, expected = self.run_eager_kind(kind, step, name)
            if action.checked and got != expected:
                record["wrong"] = f"got {got!r}, expected {expected!r}"
            return record
        dtype = action.dtype or step.dtype
        inputs, call, expected = self.build(kind, step, name, dtype, step.cols + action.extra_cols)
        got = self.run_tensors(step.mode, inputs, call)
        if action.checked:
            for g, e in zip(got, expected):
                if g.shape != e.shape or not np.array_equal(g, e):
                    record["wrong"] = f"got {g.tolist()!r}, expected {e.tolist()!r}"
        return record


def resync(seed: int, size: int) -> Dict[str, Any]:
    """All ranks meet; retried while the others are still ending their stalls."""
    start = time.monotonic()
    errors = []
    for attempt in range(1, SYNC_ATTEMPTS + 1):
        try:
            value = int(hvd.allreduce(tf.constant(1), op=hvd.Sum, name=f"fuzz{seed}.sync"))
            return {"ok": value == size, "value": value, "attempts": attempt,
                    "seconds": time.monotonic() - start, "errors": errors}
        except Exception as e:  # noqa: BLE001  (every failure is recorded)
            errors.append(str(e)[:300])
            if "shut down" in str(e):
                break
    return {"ok": False, "attempts": len(errors), "seconds": time.monotonic() - start,
            "errors": errors}


def join() -> Dict[str, Any]:
    """hvd.join(), recorded like a step."""
    t0 = time.monotonic()
    try:
        hvd.join()
        return {"join": True, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001  (every failure is recorded)
        return {"join": True, "error": str(e)[:600], "seconds": time.monotonic() - t0}


def run_program(runner: Runner, spec: str, out) -> None:
    size, rank = runner.size, runner.rank
    program = programs.from_spec(spec, size)
    seed = program.seed
    sleep_s = float(os.environ.get("FUZZ_SLEEP_SECONDS", "5"))
    record: Dict[str, Any] = {"seed": seed, "rank": rank, "program": program.describe(),
                              "steps": []}
    start = time.monotonic()

    def flush():
        record["seconds"] = time.monotonic() - start
        out.write(json.dumps(record) + "\n")
        out.flush()

    for action in programs.actions_for(program, rank, sleep_s):
        if action.what == "sleep":
            time.sleep(action.seconds)
            continue
        if action.what == "exit":
            record["exited"] = True
            flush()
            sys.exit(0)
        if action.what == "join":
            record["steps"].append(join())
            break
        t0 = time.monotonic()
        try:
            step_record = runner.run_action(seed, action)
        except RaisedOnPurpose as e:
            record["steps"].append({"i": action.step.index, "raised": str(e),
                                    "seconds": time.monotonic() - t0})
            continue
        except Exception as e:  # noqa: BLE001  (every failure is recorded)
            record["steps"].append({"i": action.step.index, "kind": action.step.kind,
                                    "mode": action.step.mode, "error": str(e)[:600],
                                    "seconds": time.monotonic() - t0})
            break
        step_record["seconds"] = time.monotonic() - t0
        record["steps"].append(step_record)
    if programs.uses_join(program) and not any(s.get("join") for s in record["steps"]):
        # The ranks that did not join early join at the end, also after a
        # failed step: the ranks that joined wait for them.
        record["steps"].append(join())
    record["sync"] = resync(seed, size)
    record["done"] = True
    flush()


def main(argv: List[str]) -> int:
    out_dir, specs = Path(argv[0]), argv[1:]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    process_set = hvd.add_process_set(programs.set_ranks(size)) if size >= 3 else None
    runner = Runner(rank, size, process_set)
    with open(out_dir / f"rank{rank}.jsonl", "a", encoding="utf-8") as out:
        for spec in specs:
            run_program(runner, spec, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
