"""An ipcluster profile that starts ddnb's engines on several machines over ssh.

    cp -r examples/profiles/ssh ~/.ipython/profile_ddnb-ssh
    # edit HOSTS below, then, on the machine that runs JupyterLab:
    .venv/bin/ipcluster start --profile=ddnb-ssh --daemonize
    # in a notebook:
    cluster = ddnb.Cluster(n=8, profile="ddnb-ssh")             # 8 = the engines listed below

What every host needs (ipyparallel's SSHEngineSetLauncher, docs: "ipcluster and ssh"):
  * password-less ssh from this machine (`ssh node1 true` must work without a prompt);
  * the same checkout of ddnb at the same path, set up with `make setup` (or a shared
    home/NFS): the engines run PYTHON below, which must import ddnb, torch and ipyparallel;
  * this machine reachable on the controller's ports: CONTROLLER_IP='*' listens on every
    interface and CONTROLLER_HOST is the name the engines connect to;
  * the hosts reachable from each other on a TCP port for torch.distributed's rendezvous
    (rank 0's host; ddnb.Cluster(master_addr=...) picks another address).

ddnb groups ranks by host (rank order = (host, engine id)), so local_rank counts engines
within a host: with nccl, give each host as many engines as it has GPUs. ddnb sets each
engine's intra-op threads to the host's cores / its engines when it connects.
Tested in tests/test_profiles.py with an `ssh` that runs its command on this machine.
"""
import os
import socket
import sys

c = get_config()  # noqa: F821 - defined by IPython's config loader

HOSTS = {"node1": 4, "node2": 4}            # host (or user@host:port) -> engines on it
PYTHON = sys.executable                     # the venv's python, at the same path everywhere
CONTROLLER_IP = "*"                         # the controller listens on every interface
CONTROLLER_HOST = socket.getfqdn()          # ... and engines reach it by this name

c.Cluster.engine_launcher_class = "ssh"
c.Cluster.controller_ip = CONTROLLER_IP
c.Cluster.controller_location = CONTROLLER_HOST
c.Cluster.n = sum(HOSTS.values())
c.SSHEngineSetLauncher.engines = HOSTS
c.SSHEngineSetLauncher.remote_python = PYTHON
c.SSHLauncher.ssh_args = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
c.SSHLauncher.scp_args = ["-q", "-o", "BatchMode=yes"]
