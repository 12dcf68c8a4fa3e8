"""How `hvdkerasrun` reaches other hosts: the ssh command and its options,
the network interfaces the ranks use, the address the hosts reach the
launcher at, and the check that every host answers before anything starts.

Pure (but for `check_reachable`, which runs the ssh command): the MPI
launcher's arguments and the ranks' environment come from a `RemoteAccess`,
for MPICH's Hydra and for Open MPI.

What may import this module: the rest of `hvdkeras.runner`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shlex
import socket
import subprocess
from typing import Dict, List, Optional, Sequence

from hvdkeras.runner import mpi_env

# How long one host may take to answer the reachability check.
REACH_TIMEOUT_S = 20.0
# Names that are always this machine.
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
# Ranks read the interfaces from here (UCX and libfabric, MPICH's network
# modules, each have their own variable; the engine reports it in `check`).
INTERFACES_ENV = "HVDKERAS_NETWORK_INTERFACES"


@dataclasses.dataclass(frozen=True)
class RemoteAccess:
    """horovodrun's ssh options, and where the launcher is reached.

    ssh_command: what starts a command on another host, called like ssh:
        `CMD [options] HOST COMMAND` (words split as a shell would).
    ssh_port, identity_file: passed to it as `-p PORT` and `-i FILE`.
    network_interfaces: the interfaces (e.g. ("eth0",)) that MPI's control
        and data traffic uses on every host.
    launcher_address: the address the other hosts reach this machine at
        (default: its hostname).
    through_slurm: the hosts are the nodes of the Slurm allocation this
        launcher runs in: processes start there through Slurm (Hydra's
        `-launcher slurm`, which calls srun; Open MPI finds the allocation
        itself), not ssh, and nothing is checked with ssh first.
    """

    ssh_command: str = "ssh"
    ssh_port: Optional[int] = None
    identity_file: Optional[str] = None
    network_interfaces: tuple = ()
    launcher_address: Optional[str] = None
    through_slurm: bool = False

    def is_default(self) -> bool:
        return self == RemoteAccess()


def ssh_words(access: RemoteAccess) -> List[str]:
    """The ssh command with the options every call gets. Pure.

    >>> ssh_words(RemoteAccess(ssh_port=2222, identity_file="/k"))
    ['ssh', '-p', '2222', '-i', '/k']
    """
    words = shlex.split(access.ssh_command)
    if not words:
        raise ValueError("--ssh-command is empty; give the program that starts commands on "
                         "other hosts, called like ssh (CMD [options] HOST COMMAND).")
    if access.ssh_port is not None:
        if not 0 < access.ssh_port < 65536:
            raise ValueError(f"--ssh-port must be a port number (1-65535), not {access.ssh_port}.")
        words += ["-p", str(access.ssh_port)]
    if access.identity_file:
        words += ["-i", access.identity_file]
    return words


def launcher_script(access: RemoteAccess) -> str:
    """A shell script that runs the ssh command with its options and the
    arguments it is given (what Hydra's -launcher-exec takes: one path). Pure."""
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in ssh_words(access)) + ' "$@"\n'


def mpiexec_args(access: RemoteAccess, vendor: str, script: Optional[str],
                 remote_hosts: bool) -> List[str]:
    """The MPI launcher's options for `access`: how other hosts are reached
    (when there are any; `script`: the path of `launcher_script`, for
    Hydra), the interfaces, the launcher's address. Pure."""
    args: List[str] = []
    if vendor == mpi_env.OPENMPI:
        if remote_hosts:
            words = ssh_words(access)
            args += ["--mca", "plm_rsh_agent", words[0]]
            if len(words) > 1:
                args += ["--mca", "plm_rsh_args", " ".join(words[1:])]
        if access.network_interfaces:
            interfaces = ",".join(access.network_interfaces)
            args += ["--mca", "btl_tcp_if_include", interfaces,
                     "--mca", "oob_tcp_if_include", interfaces]
        return args
    if access.through_slurm:
        args += ["-launcher", "slurm"]
    elif script is not None:
        args += ["-launcher", "ssh", "-launcher-exec", script]
    if access.launcher_address:
        args += ["-localhost", access.launcher_address]
    elif access.network_interfaces:
        # Hydra takes the address the hosts call back to from -iface, read
        # on the launcher, and lets it win over -localhost; the launcher's
        # interface of that name may not be on the hosts' network (a
        # launcher outside the cluster), so an address given wins here. The
        # ranks' own traffic follows rank_env either way.
        args += ["-iface", access.network_interfaces[0]]
    return args


def rank_env(access: RemoteAccess) -> Dict[str, str]:
    """Variables every rank gets so that MPI's data traffic takes the chosen
    interfaces (UCX, libfabric). Pure."""
    if not access.network_interfaces:
        return {}
    interfaces = ",".join(access.network_interfaces)
    return {INTERFACES_ENV: interfaces, "UCX_NET_DEVICES": interfaces,
            "FI_TCP_IFACE": access.network_interfaces[0],
            "FI_SOCKETS_IFACE": access.network_interfaces[0]}


def picks_own_launcher(mpi_args: Sequence[str]) -> bool:
    """Whether the user's --mpi-args choose how processes start (Hydra's
    -launcher/-bootstrap, Open MPI's plm), so hvdkerasrun's ssh is not used. Pure."""
    words = list(mpi_args)
    return any(w in ("-launcher", "-bootstrap", "-launcher-exec", "-bootstrap-exec")
               or (w == "plm" or w.startswith("plm_")) for w in words)


def remote_hosts(hosts: Sequence[str], local_names: Sequence[str]) -> List[str]:
    """The hosts that are not this machine, in order, each once. Pure."""
    local = {n.lower() for n in (*LOCAL_NAMES, *local_names)}
    out: List[str] = []
    for host in hosts:
        if host.lower() not in local and host not in out:
            out.append(host)
    return out


def this_machine_names() -> List[str]:
    names = [socket.gethostname(), socket.getfqdn()]
    try:
        names += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    return names


def unreachable_message(failures: Dict[str, str], access: RemoteAccess) -> str:
    """The error when some hosts did not answer. Pure."""
    command = " ".join(ssh_words(access))
    listed = "; ".join(f"{host}: {why}" for host, why in failures.items())
    return (f"hvdkerasrun: {len(failures)} host(s) could not be reached with `{command} HOST "
            f"true`, so nothing was started: {listed}. Check the host names, that this machine "
            "can log in to them without a password (--ssh-identity-file, --ssh-port), or give "
            "the command that starts processes there with --ssh-command.")


def check_reachable(access: RemoteAccess, hosts: Sequence[str],
                    timeout: float = REACH_TIMEOUT_S) -> Dict[str, str]:
    """Runs `ssh HOST true` on every host at once; host -> why it failed."""
    words = ssh_words(access)
    batch = [] if access.ssh_command != "ssh" else [
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", f"ConnectTimeout={int(timeout)}"]

    def probe(host: str) -> Optional[str]:
        try:
            done = subprocess.run([*words, *batch, host, "true"], capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout:g} s"
        except OSError as error:
            return str(error)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            return last[:300]
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        results = dict(zip(hosts, pool.map(probe, hosts)))
    return {host: why for host, why in results.items() if why}


def write_launcher_script(access: RemoteAccess, directory: str) -> str:
    """Writes `launcher_script` into `directory`; returns its path."""
    path = os.path.join(directory, "remote-launcher")
    with open(path, "w", encoding="utf-8") as f:
        f.write(launcher_script(access))
    os.chmod(path, 0o755)
    return path
