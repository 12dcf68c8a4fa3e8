"""horovod.tensorflow.util: the one helper Horovod's tests import."""
from tensorflow import executing_eagerly as _executing_eagerly  # noqa: F401
