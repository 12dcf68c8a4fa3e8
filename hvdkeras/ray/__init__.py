"""Ray integration: `run(fn, ...)` on Ray actors, one rank per actor.

Needs the ``[ray]`` extra (ray), imported only when `run` is called. The
ranks form one MPI world as `hvdkeras.cluster.job` describes; `runner` holds
what is Ray's own (the placement group, the actors, ending them).

What may import it: user code (`import hvdkeras.ray`). It imports
`hvdkeras.cluster` and `hvdkeras.runner`.
"""

from hvdkeras.ray.runner import run

__all__ = ["run"]
