"""Fails on the first attempt only: rank 1 leaves a marker file and exits 4."""
import os
import sys

import hvdkeras as hvd

marker = sys.argv[1]
hvd.init()
if hvd.rank() == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    print("first attempt: failing on purpose", flush=True)
    sys.exit(4)
total = hvd.allreduce([1.0], op=hvd.Sum, name="after_restart")
print(f"COMPLETED attempt {os.environ['HVDKERAS_ATTEMPT']} sum {float(total.numpy()[0]):g}", flush=True)
