"""Decentralized training: no server, no all-reduce; each worker averages with a few
neighbours (gossip), or with one partner, or every H steps, or elastically with a center.

    from ddnb.decentralized import DecentralizedConfig, train_dpsgd
    config = DecentralizedConfig(topology="ring", steps=200, lr=0.1)
    results = cluster.run(train_dpsgd, config, partial(mlp, (64, 32, 10)), train_set, test_set)

Every rank is a worker (`worker.py`) with its own copy of the parameters; every message
goes through `ddnb.collectives.p2p`, so every byte is in the trace.

    topology.py    mixing matrices W: ring, torus, exponential, complete; check_mixing; spectral_gap
    gossip.py      one gossip step x_i <- sum_j W_ij x_j over p2p; consensus distance (a measurement)
    config.py      DecentralizedConfig: the knobs of every method; validate lists every broken rule
    worker.py      what every method does alike on a rank: gradients, measurements, bytes, stats
    dpsgd.py       D-PSGD (Lian et al. 2017): gossip with the neighbours, local step
    adpsgd.py      AD-PSGD (Lian et al. 2018): pairwise averaging on a matching schedule
    local_sgd.py   local SGD / periodic averaging (Stich 2019; Lin et al. 2020); all-reduce SGD
    easgd.py       EASGD (Zhang, Choromanska & LeCun 2015): elastic pull toward a center
    decentralized_ps.py   shards held and served by the workers themselves (ASP), no server rank
    hogwild.py     Hogwild! (Recht et al. 2011): lock-free updates of shared memory, conflict rate
    cost.py        the bytes each method sends and receives, as formulas
    reference.py   every method simulated in one process (what the tests compare with)
    diloco.py      DiLoCo (Douillard et al. 2023) and streaming DiLoCo (2025) against DDP, with their
                   one-process reference simulate_diloco; markov.py: their task (a Markov chain's tokens)

Taught in `notebooks/05b_decentralized.ipynb`.
"""
from ddnb.decentralized.adpsgd import matching, train_adpsgd
from ddnb.decentralized.config import ORDERS, DecentralizedConfig
from ddnb.decentralized.cost import METHODS, per_step, ring_allreduce_bytes, run_bytes
from ddnb.decentralized.decentralized_ps import train_decentralized_ps
from ddnb.decentralized.diloco import (DiLoCoConfig, outer_step, simulate_diloco, sync_schedule, train_diloco,
                                       train_streaming_diloco)
from ddnb.decentralized.dpsgd import train_dpsgd
from ddnb.decentralized.easgd import train_easgd
from ddnb.decentralized.gossip import consensus_distance, gossip, mean_params, start_gossip
from ddnb.decentralized.local_sgd import averages_after, train_allreduce_sgd, train_local_sgd
from ddnb.decentralized.reference import SIMULATED, simulate
from ddnb.decentralized.topology import (TOPOLOGIES, Topology, check_mixing, complete, exponential, from_matrix,
                                         metropolis_hastings, ring, spectral_gap, topology, torus)

TRAIN = {"allreduce_sgd": train_allreduce_sgd, "local_sgd": train_local_sgd, "dpsgd": train_dpsgd,
         "adpsgd": train_adpsgd, "easgd": train_easgd, "decentralized_ps": train_decentralized_ps}

__all__ = ["DiLoCoConfig", "outer_step", "simulate_diloco", "sync_schedule", "train_diloco",
           "train_streaming_diloco", "DecentralizedConfig", "METHODS", "ORDERS", "SIMULATED", "TOPOLOGIES", "TRAIN", "Topology",
           "averages_after", "check_mixing", "complete", "consensus_distance", "exponential", "from_matrix",
           "gossip", "matching", "mean_params", "metropolis_hastings", "per_step", "ring", "ring_allreduce_bytes",
           "run_bytes", "simulate", "spectral_gap", "start_gossip", "topology", "torus", "train_adpsgd",
           "train_allreduce_sgd", "train_decentralized_ps", "train_dpsgd", "train_easgd", "train_local_sgd"]
