"""Rank 1 submits collectives at the moment rank 0's copies of them stall out.

    mpiexec -n 2 python stall_race_job.py BOUND_SECONDS

Rank 0 submits N allreduces at once and waits; rank 1 submits the same
names one by one, spread over the half second around the moment rank 0's
stall shutdown fails them, so some arrive in the very cycle of the failure
(Note [stall shutdown after the cycle's requests] in ops/core/negotiation.cc).
Then rank 0 at once submits the names again while rank 1 runs nothing: a
name of rank 1 that arrived after the failure pairs with this round, any
other must end with a stall error. Before that note, a name whose request
arrived in the failure cycle stayed behind in rank 0's coordinator for
another stall bound, the second round found it "ready", and rank 0 ran the
collective alone: both engines stuck, no stall check running, a silent hang.
Prints RESULT <json> per rank.
"""
import json
import sys
import threading
import time

import tensorflow as tf

import hvdkeras as hvd

N = 160
bound = float(sys.argv[1])
hvd.init()
rank = hvd.rank()
names = [f"race.{i}" for i in range(N)]


@tf.function
def all_at_once(x):
    return [hvd.allreduce(x, op=hvd.Sum, name=n) for n in names]


def outcome(call):
    try:
        call()
        return "ok"
    except Exception as e:  # the error is the result
        text = str(e)
        return text[text.find("Collective"):][:160] if "Collective" in text else text[:160]


all_at_once.get_concrete_function(tf.TensorSpec([], tf.float32))  # traced before the clock
hvd.allreduce(tf.constant(1.0), name="race.start")
start = time.monotonic()
result = {"rank": rank}
if rank == 0:
    result["first"] = outcome(lambda: all_at_once(tf.constant(1.0)))
else:
    outcomes = [None] * N

    def submit(i):
        time.sleep(max(0.0, start + bound - 0.05 + i * 0.5 / N - time.monotonic()))
        outcomes[i] = outcome(lambda: hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name=names[i]))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["first"] = outcomes
    # Errors saying this rank never submitted the name hit the failure cycle.
    result["in_failure_cycle"] = sum("rank(s) 1 never submitted" in o for o in outcomes)
# Rank 0 submits the names again at once, while rank 1 runs nothing more.
second_start = time.monotonic()
if rank == 0:
    result["second"] = outcome(lambda: all_at_once(tf.constant(1.0)))
else:
    time.sleep(bound * 2 + 3)
result["second_seconds"] = time.monotonic() - second_start
print("RESULT " + json.dumps(result), flush=True)
