"""The command-line options for reaching other hosts, shared by
`hvdkerasrun` and `hvdkeras train`: one definition, so both take the same
flags with the same meaning (horovodrun's names).

What may import this module: `hvdkeras.runner.cli` and `hvdkeras.cli`.
"""

from __future__ import annotations

import argparse

from hvdkeras.runner.remote import RemoteAccess


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds --ssh-command, --ssh-port, --ssh-identity-file,
    --network-interfaces and --launcher-address as a group of `parser`."""
    group = parser.add_argument_group(
        "other hosts (checked before anything starts: each must answer)")
    group.add_argument("--ssh-command", default="ssh",
                       help="what starts processes on other hosts, called like ssh: "
                            "CMD [options] HOST COMMAND (default: ssh)")
    group.add_argument("--ssh-port", "-p", type=int, help="the port --ssh-command connects to")
    group.add_argument("--ssh-identity-file", "-i", help="the private key --ssh-command uses")
    group.add_argument("--network-interfaces", "--network-interface", dest="network_interfaces",
                       help="comma-separated interfaces (e.g. eth0) for MPI's traffic on "
                            "every host")
    group.add_argument("--launcher-address",
                       help="the address the other hosts reach this machine at (default: "
                            "its name)")


def remote_access_from_args(args: argparse.Namespace, through_slurm: bool = False) -> RemoteAccess:
    """The `RemoteAccess` the options of `add_remote_arguments` describe
    (`through_slurm`: the hosts are a Slurm allocation's, reached with srun)."""
    interfaces = tuple(name.strip() for name in (args.network_interfaces or "").split(",")
                       if name.strip())
    return RemoteAccess(ssh_command=args.ssh_command, ssh_port=args.ssh_port,
                        identity_file=args.ssh_identity_file, network_interfaces=interfaces,
                        launcher_address=args.launcher_address, through_slurm=through_slurm)
