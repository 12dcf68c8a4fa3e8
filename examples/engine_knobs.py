"""Prints, on every rank, the engine settings it runs with, then sums the ranks.

    hvdkerasrun -np 2 --fusion-threshold-mb 2 --cycle-time-ms 3.5 python examples/engine_knobs.py

Each line comes out prefixed with its rank (``[1]<stdout>: ...``); the values
show that the launcher's flags reached the engine.
"""

import hvdkeras as hvd

hvd.init()
config = hvd.engine_config()
print(f"rank {hvd.rank()} of {hvd.size()}: fusion_threshold={config.fusion_threshold} bytes, "
      f"cycle_time_ms={config.cycle_time_ms:g}, stall_check_seconds={config.stall_check_seconds:g}, "
      f"timeline={config.timeline_path or '-'}, autotune={config.autotune}", flush=True)
total = hvd.allreduce([float(hvd.rank())], op=hvd.Sum, name="rank_sum")
print(f"sum of ranks: {float(total.numpy()[0]):g}", flush=True)
