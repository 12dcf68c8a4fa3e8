"""A stand-in for an MPI launcher, for testing what hvdkerasrun does around it.

    fake_mpiexec.py --version          prints $FAKE_MPIEXEC_VERSION (default: Hydra's banner)
    fake_mpiexec.py -n N CMD...        starts N copies of CMD, each with $FAKE_RANK_VAR=i

Unlike a real mpiexec it never ends the other copies when one fails (so the
launcher's own fail-fast is what ends them), and it starts no MPI: each copy
initialises MPI as a singleton, i.e. a world of size 1.
"""
import os
import subprocess
import sys

argv = sys.argv[1:]
if "--version" in argv:
    print(os.environ.get("FAKE_MPIEXEC_VERSION", "HYDRA build details:\n    Version: 5.0.2"))
    sys.exit(0)
n = int(argv[argv.index("-n") + 1])
command = argv[argv.index("-n") + 2:]
rank_var = os.environ.get("FAKE_RANK_VAR", "OMPI_COMM_WORLD_RANK")
children = [subprocess.Popen(command, env={**os.environ, rank_var: str(i)}) for i in range(n)]
sys.exit(max(abs(child.wait()) for child in children))
