"""horovod.keras.callbacks: hvdkeras.callbacks."""
from hvdkeras.callbacks import *  # noqa: F401,F403
