"""Calls hvdkeras.init() and prints the world size."""
import hvdkeras as hvd

hvd.init()
print(f"SIZE {hvd.size()}", flush=True)
