"""An ipcluster profile that starts ddnb's engines as one Slurm job.

    cp -r examples/profiles/slurm ~/.ipython/profile_ddnb-slurm
    # edit the Slurm settings below, then, on a login node (or the node running JupyterLab):
    .venv/bin/ipcluster start -n 8 --profile=ddnb-slurm --daemonize
    # in a notebook, once the job runs (squeue --me):
    cluster = ddnb.Cluster(n=8, profile="ddnb-slurm", timeout=120)

ipyparallel's SlurmEngineSetLauncher writes ENGINE_TEMPLATE below to the profile directory
as slurm_engine.sbatch, with n engines, and submits it with sbatch; `ipcluster stop`
cancels the job (scancel). The controller runs where ipcluster runs (Cluster.controller_ip
'*' so that compute nodes reach it). As with ssh, every node must see the same ddnb
checkout and venv (a shared home), and the nodes reach each other for torch.distributed's
rendezvous on rank 0's node. With one GPU per engine, ask Slurm for GPUs per task; ddnb
picks nccl when every engine has a GPU of its own, and `local_rank` counts within a node.
Tested in tests/test_profiles.py with an sbatch/srun/scancel that run the job on this
machine.
"""
import os
import socket
import sys

c = get_config()  # noqa: F821 - defined by IPython's config loader

PARTITION = ""                      # e.g. "gpu"; empty: the cluster's default
ACCOUNT = ""                        # e.g. "proj123"; empty: your default account
TIME_LIMIT = "01:00:00"             # the engines' job ends after this (Slurm's --time)
PYTHON = sys.executable             # the venv's python, at the same path on every node

c.Cluster.engine_launcher_class = "slurm"
c.Cluster.controller_ip = "*"
c.Cluster.controller_location = socket.getfqdn()
c.SlurmEngineSetLauncher.engine_cmd = [PYTHON, "-m", "ipyparallel.engine"]
# The job script. A batch_template replaces ipyparallel's, options and all, so every
# #SBATCH line is here; {n}, {cluster_id} and {program_and_args} (the ipengine command,
# with this profile's directory and cluster id) are filled in by ipyparallel.
SBATCH = [
    "--job-name=ddnb-engines-{cluster_id}",
    "--ntasks={n}",                 # one task = one engine = one ddnb worker
    "--cpus-per-task=1",            # with more, pass ddnb.Cluster(threads=) the same number
    f"--time={TIME_LIMIT}",
    "--export=ALL",
    "--output={profile_dir}/log/ddnb-engines-%j.log",
    # "--gpus-per-task=1",          # one GPU per engine: ddnb then uses nccl
]
SBATCH += [f"--partition={PARTITION}"] if PARTITION else []
SBATCH += [f"--account={ACCOUNT}"] if ACCOUNT else []
# the job script is written beside this file (else: into the directory ipcluster ran in)
c.SlurmEngineSetLauncher.batch_file_name = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm_engine.sbatch")
c.SlurmEngineSetLauncher.batch_template = "\n".join(
    ["#!/bin/sh", *(f"#SBATCH {option}" for option in SBATCH),
     "srun --kill-on-bad-exit=1 {program_and_args}", ""])
