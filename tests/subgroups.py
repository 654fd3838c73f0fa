"""Process groups of 2, 3 and 4 ranks inside the session's world(4), for the tests of the
context- and expert-parallel layers (group ranks differ from global ranks, as in a real
job), and the one way those tests gather their per-rank results."""
import torch.distributed as dist

WORLD = 4
MEMBERS = [[1, 3], [0, 2, 3], list(range(WORLD))]
_groups: dict = {}   # per rank process: the groups of MEMBERS, made once


def groups():
    """[(group, size)] of the groups of MEMBERS this rank belongs to (None: the whole
    world). Every rank calls dist.new_group for each, in the same order, the first time."""
    if not _groups:
        for ranks in MEMBERS[:-1]:
            _groups[tuple(ranks)] = dist.new_group(ranks)
        _groups[tuple(MEMBERS[-1])] = None
    return [(_groups[tuple(r)], len(r)) for r in MEMBERS if dist.get_rank() in r]


def group_of_size(n):
    """This rank's group of n ranks, or "none" when it is not a member."""
    return next((g for g, size in groups() if size == n), "none")


def run_all(world, fn):
    """fn on every rank of world(4); the lists they return, concatenated in rank order."""
    return [res for rank_results in world(WORLD).run(fn) for res in rank_results]
