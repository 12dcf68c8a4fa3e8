"""What this hvdkeras was built with and runs on, under Horovod's names
(`mpi_built()`, `nccl_built()`, ...), so scripts and tests written for Horovod
can ask the same questions.

hvdkeras always runs on MPI (mpi4py); its GPU part, when the op library has
one, reduces GPU tensors with NCCL on CUDA. It has no Gloo, oneCCL, ROCm, DDL
or MLSL backend, so those answer False.

What may import this module: anything above `hvdkeras.engine`.
"""

from __future__ import annotations

from hvdkeras.engine import c_api, library, world


def mpi_built() -> bool:
    """Whether hvdkeras was built with MPI support: always (it runs on MPI).

    Example:

    ```python
    assert hvd.mpi_built()
    ```
    """
    return True


def mpi_enabled() -> bool:
    """Whether MPI carries this process's collectives now: once `init()` has run."""
    return world.is_initialized()


def _gpu_part() -> bool:
    return c_api.build_flavor(library.engine_handle()) != "cpu"


def nccl_built() -> bool:
    """Whether the op library was built with its GPU part, which reduces GPU tensors with NCCL."""
    return _gpu_part()


def cuda_built() -> bool:
    """Whether the op library was built with its CUDA (GPU) part."""
    return _gpu_part()


def gloo_built() -> bool:
    """False: hvdkeras has no Gloo backend (it runs on MPI)."""
    return False


def gloo_enabled() -> bool:
    """False: hvdkeras has no Gloo backend (it runs on MPI)."""
    return False


def ccl_built() -> bool:
    """False: hvdkeras has no oneCCL backend."""
    return False


def rocm_built() -> bool:
    """False: hvdkeras has no ROCm backend."""
    return False


def ddl_built() -> bool:
    """False: hvdkeras has no IBM DDL backend."""
    return False


def mlsl_built() -> bool:
    """False: hvdkeras has no Intel MLSL backend."""
    return False
