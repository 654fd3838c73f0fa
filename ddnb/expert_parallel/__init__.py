"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks,
tokens sent to them and back by the uneven all-to-all.

    router.py   top-k gating, capacity and dropped tokens, the load-balancing loss (Switch)
    moe.py      MoE (one process, the reference), ExpertParallelMoE (E/N experts per rank),
                sync_router_grads, moe_bytes_per_rank
    training.py train_dp_ep on a ddnb.ProcessGrid(dp, ep): equal to one process
    load.py     moe_load: where one forward's tokens went (received, dropped, bytes), for the widget

Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from ddnb.expert_parallel.moe import ExpertParallelMoE, MoE, expert_mlp, moe_bytes_per_rank, sync_router_grads
from ddnb.expert_parallel.router import Routing, capacity_of, route
from ddnb.expert_parallel.training import train_dp_ep, train_moe_reference

__all__ = ["ExpertParallelMoE", "MoE", "Routing", "capacity_of", "expert_mlp", "moe_bytes_per_rank", "route",
           "sync_router_grads", "train_dp_ep", "train_moe_reference"]
