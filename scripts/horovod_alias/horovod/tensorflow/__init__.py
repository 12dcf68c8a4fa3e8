"""`import horovod.tensorflow as hvd`: hvdkeras under Horovod's name."""
from tensorflow import executing_eagerly as _executing_eagerly  # noqa: F401  Horovod's helper

from hvdkeras import *  # noqa: F401,F403
from hvdkeras import callbacks, elastic  # noqa: F401
from horovod.tensorflow import util  # noqa: F401
