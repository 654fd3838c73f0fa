"""The world sizes a checker runs: always two, one of them not a power of two, so that a
ring, a tree or a chunking that only works for 2, 4, 8 ranks (or only for the size the
notebook happens to use) is caught.

    with Checks("check_allreduce") as check:
        sizes = world_sizes(check, world_size, (3, 4), min_world=1)   # world_size=3 -> (3, 4)

A notebook's `world_size=n` is kept as the first size run, and a second is added:
3 when n is a power of two (1, 2, 4, 8), else 4. Without it the checker's default pair
runs. Used by the checkers that refuse shortcuts (`ddnb.exercises.guard`), from
`notebooks/03_collectives.ipynb` on.
"""
from __future__ import annotations

from ddnb._checks import Checks, is_int

MAX_WORLD = 8


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def companion(n: int) -> int:
    """The second world size run with n: 3 for a power of two, else 4."""
    return 3 if is_power_of_two(n) else 4


def world_sizes(check: Checks, world_size, default: tuple, min_world: int = 1) -> tuple:
    """The sizes to run, validated into `check` (one ValueError per call lists every bad
    argument): (world_size, companion(world_size)) when world_size is given, else `default`."""
    if world_size is None:
        sizes = tuple(default)
        check.rule(isinstance(default, (list, tuple)) and len(sizes) > 0
                   and all(is_int(n) and min_world <= n <= MAX_WORLD for n in sizes),
                   f"world_sizes={default!r}: need integers >= {min_world} and <= {MAX_WORLD}")
        return sizes
    if not check.integer("world_size", world_size, min=min_world, max=MAX_WORLD):
        return ()
    return (world_size, companion(world_size))


def in_words(sizes) -> str:
    """'3 and 4 processes'."""
    sizes = list(sizes)
    return (" and ".join([", ".join(map(str, sizes[:-1])), str(sizes[-1])]) if len(sizes) > 1
            else str(sizes[0])) + " processes"
