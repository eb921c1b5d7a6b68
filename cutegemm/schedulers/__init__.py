"""Tile schedulers: which output tile a persistent CTA (cluster) computes next.

``static`` (strided walk), ``grouped`` (tile -> (expert, m, n) from offs, on the device), and the
dynamic ones (``dynamic``: atomic counter; ``clc``: sm_100a cluster launch control) that wrap
either map behind a shared-memory broadcast ring. ``GemmConfig.scheduler`` picks one.
"""

from .dynamic import BroadcastScheduler, clc_grid_clusters, simulate_clc, simulate_dynamic
from .static import StaticPersistentScheduler, TileScheduler, swizzled_tile_coord

__all__ = [
    "BroadcastScheduler",
    "StaticPersistentScheduler",
    "TileScheduler",
    "clc_grid_clusters",
    "simulate_clc",
    "simulate_dynamic",
    "swizzled_tile_coord",
]
