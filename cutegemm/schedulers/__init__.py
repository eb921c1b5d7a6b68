"""Tile schedulers: which output tile a persistent CTA (cluster) computes next."""

from .static import StaticPersistentScheduler, TileScheduler, swizzled_tile_coord

__all__ = ["StaticPersistentScheduler", "TileScheduler", "swizzled_tile_coord"]
