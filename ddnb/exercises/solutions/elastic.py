"""Solutions of `ddnb.exercises.elastic` (`notebooks/15_elastic_training.ipynb`)."""
from __future__ import annotations


def remaining_share(order: list[int], consumed: int, rank: int, world_size: int) -> list[int]:
    """Rank `rank` of `world_size`'s share of the unread samples: strided, uneven tail."""
    rest = order[consumed:]            # the samples no rank has read yet, in the epoch's order
    return rest[rank::world_size]      # ranks r < len(rest) % world_size read one more
