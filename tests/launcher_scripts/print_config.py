"""Prints what the engine sees on this rank (used by the hvdkerasrun tests)."""
import json
import os

import hvdkeras as hvd

hvd.init()
config = hvd.engine_config()
print("ENGINE " + json.dumps({
    "rank": hvd.rank(), "size": hvd.size(),
    "fusion_threshold": config.fusion_threshold, "cycle_time_ms": config.cycle_time_ms,
    "stall_check_seconds": config.stall_check_seconds, "timeline_path": config.timeline_path,
    "autotune": config.autotune, "attempt": os.environ.get("HVDKERAS_ATTEMPT"),
}), flush=True)
total = hvd.allreduce([float(hvd.rank() + 1)], op=hvd.Sum, name="ranks_sum")
print(f"SUM {float(total.numpy()[0]):g}", flush=True)
