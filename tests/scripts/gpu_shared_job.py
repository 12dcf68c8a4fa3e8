"""Two ranks on one GPU must fail clearly on both ranks (scripts/gpu_check.sh):
starts them with the same CUDA_VISIBLE_DEVICES and no pinning, runs a GPU
allreduce (of TensorFlow, or under KERAS_BACKEND=torch of PyTorch), and
exits 0 only if the job failed and each rank's error names the GPU both use.

    python tests/scripts/gpu_shared_job.py
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

RANK_CODE = """
import tensorflow as tf
import hvdkeras as hvd
hvd.init()
try:
    with tf.device('/GPU:0'):
        hvd.allreduce(tf.ones([8]), op=hvd.Sum).numpy()
    print(f'rank {hvd.rank()}: NO ERROR', flush=True)
except Exception as error:
    print(f'rank {hvd.rank()}: ERROR {error}', flush=True)
hvd.shutdown()
"""

# Under KERAS_BACKEND=torch the same with CUDA tensors of PyTorch (no TensorFlow).
TORCH_RANK_CODE = """
import torch
import hvdkeras as hvd
hvd.init()
try:
    hvd.allreduce(torch.ones(8, device='cuda:0'), op=hvd.Sum).cpu()
    print(f'rank {hvd.rank()}: NO ERROR', flush=True)
except Exception as error:
    print(f'rank {hvd.rank()}: ERROR {error}', flush=True)
hvd.shutdown()
"""
if os.environ.get("KERAS_BACKEND") == "torch":
    RANK_CODE = TORCH_RANK_CODE

here = Path(sys.executable).parent
mpiexec = here / "mpiexec" if (here / "mpiexec").exists() else shutil.which("mpiexec")
env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "HVDKERAS_STALL_SHUTDOWN_SECONDS": "60"}
result = subprocess.run([str(mpiexec), "-n", "2", sys.executable, "-c", RANK_CODE], env=env,
                        capture_output=True, text=True, timeout=150)
print(result.stdout[-3000:], result.stderr[-2000:])
named = [line for line in result.stdout.splitlines() if "ERROR" in line and "both use" in line]
sys.exit(0 if len(named) == 2 else 1)
