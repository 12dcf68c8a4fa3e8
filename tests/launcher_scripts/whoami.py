"""Prints rank and size from mpi4py alone (no TensorFlow: quick)."""
from mpi4py import MPI

print(f"WHOAMI {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()} on {MPI.Get_processor_name()}", flush=True)
