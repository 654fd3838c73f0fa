"""The emulated cluster: real processes, real bytes, real math, and time paced by a
profile of the hardware (devices, links, hosts), so that a 2-core laptop shows what a GPU
cluster does: a pipeline's bubble shrinking, communication hidden behind backward, the
ring overtaking the tree. Like a network emulator (Mininet: Handigol et al., CoNEXT 2012)
it runs the real program with its real messages in their real order; each rank keeps a
virtual clock that every message (its header carries the emulated time it left) and every
operation (its roofline time) advances, as SimGrid's SMPI does, and real time is paced to
it. Real: the processes, the bytes, their order and dependencies, the contention of a
rank's messages for its link. Modelled: each message's alpha + n/B and each operation's
roofline time. torch.distributed's own collectives keep torch's values and are timed by
the messages of the ring they run, sent for real (`messages.py`), so a comparison with a
cost model tests the messages' count, sizes and order, never the formula against itself.
A rank whose real work falls behind the pace lags without changing any
emulated time; only where a second thread moves its clock is a lag an overrun (`clock.py`).

    cluster = ddnb.Cluster(n=8, emulate="ib")          # or emulate=ddnb.emulate.custom(...)
    profile.py   Profile, Link, PROFILES ("10gbe", "ib", "nvlink"), custom, get_profile
    clock.py     Emulator (a worker's clock and links), current, report, summary
    session.py   activate / deactivate: a worker's emulation started (transport, pacing) and stopped
    compute.py   PacedCompute: every torch operation charged its roofline time
    messages.py  send / recv / exchange with a header; torch's collectives timed by their ring's messages
    retry.py     without_overruns: run again at a higher slowdown until no rank overran

Every time measured in emulated mode is emulated seconds of the profile, and is printed
with the profile's name. Taught in `notebooks/05_allreduce.ipynb` and
`notebooks/09_pipeline_parallelism.ipynb`.
"""
from ddnb.emulate.clock import TOLERANCE_ALPHAS, Emulator, current, lateness, report, resume, stamp, summary, warm_up
from ddnb.emulate.compute import uncounted
from ddnb.emulate.profile import PROFILES, Link, Profile, custom, get_profile
from ddnb.emulate.retry import overruns, without_overruns
from ddnb.emulate.session import activate, deactivate

__all__ = ["PROFILES", "TOLERANCE_ALPHAS", "Emulator", "lateness", "Link", "Profile", "activate", "current", "custom", "deactivate",
           "get_profile", "overruns", "report", "resume", "stamp", "summary", "warm_up", "uncounted", "without_overruns"]
