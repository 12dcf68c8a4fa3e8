"""Under torch or jax: init, pin_gpu (on a machine without GPUs) and one collective of each backend's own arrays
leave TensorFlow out of the process (Note [the engine without TensorFlow in
the process]). Prints one line per rank with the sum and whether TensorFlow
was imported."""

import sys

import keras
import numpy as np

import hvdkeras as hvd

hvd.init()
pinned = hvd.pin_gpu()  # no GPU here: None, counted without TensorFlow
values = keras.ops.convert_to_tensor(np.full((3,), hvd.rank() + 1, dtype="float32"))
total = keras.ops.convert_to_numpy(hvd.allreduce(values, op=hvd.Sum))
print(f"rank {hvd.rank()} pinned {pinned} sum {total.tolist()} tensorflow_imported "
      f"{'tensorflow' in sys.modules}", flush=True)
hvd.shutdown()
