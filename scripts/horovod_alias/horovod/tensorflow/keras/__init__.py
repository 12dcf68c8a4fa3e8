"""`import horovod.tensorflow.keras as hvd`: hvdkeras under Horovod's name."""
from hvdkeras import *  # noqa: F401,F403
from hvdkeras import callbacks, elastic  # noqa: F401
