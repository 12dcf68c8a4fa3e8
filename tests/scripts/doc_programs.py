"""Runs the programs listed in a JSON file (title, source), each in a fresh
namespace, on every rank; after each, checks that the program's `model` has
the same weights on every rank, and prints "program ok: <title>"."""

import json
import sys

import keras
import numpy as np

import hvdkeras as hvd

for title, source in json.loads(open(sys.argv[1]).read()):
    namespace = {"__name__": "__main__"}
    exec(compile(source, title, "exec"), namespace)
    model = namespace.get("model")
    assert model is not None, f"{title}: the program has no `model`"
    mine = [keras.ops.convert_to_numpy(w) for w in model.weights]
    everyone = hvd.allgather_object(mine, name=f"weights of {title}")
    for rank, theirs in enumerate(everyone):
        for a, b in zip(mine, theirs):
            assert np.array_equal(a, b), f"{title}: rank {rank}'s weights differ from this rank's"
    print(f"program ok: {title}", flush=True)
