"""Per-arch policy: machine facts plus the heuristic that picks a GemmConfig for a problem.

Tile/cluster choices were measured on the H200 (bench/RESULTS.md, `python -m cutegemm bench
sweep`); the sm_100a choices are untested defaults (no Blackwell GPU here).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import GemmConfig, GemmProblem


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ArchPolicy:
    arch: str
    num_sms: int
    smem_bytes: int

    def choose(self, p: GemmProblem, **overrides) -> GemmConfig:
        base = dict(
            arch=self.arch,
            a_dtype=p.a_dtype,
            b_dtype=p.b_dtype,
            out_dtype=p.out_dtype,
            a_major=p.a_major,
            b_major=p.b_major,
        )
        cfg = GemmConfig(**base, **self._tile(p))
        return replace(cfg, **overrides) if overrides else cfg

    def _tile(self, p: GemmProblem) -> dict:
        raise NotImplementedError


class Sm90Policy(ArchPolicy):
    def _tile(self, p: GemmProblem) -> dict:
        big_tiles = ceil_div(p.m, 128) * ceil_div(p.n, 256) * p.l
        if big_tiles >= self.num_sms:
            # Large problems: 128x256 tiles, B multicast over a 2x1 cluster halves B's L2 traffic.
            cluster_m = 2 if ceil_div(p.m, 128) >= 2 else 1
            return dict(tile_m=128, tile_n=256, cluster_m=cluster_m, raster="m", group=8)
        if p.m <= 128:
            # Decode-like: few rows; spread N over as many CTAs as possible.
            return dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, raster="n", group=1)
        return dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, raster="m", group=8)


class Sm100Policy(ArchPolicy):
    def _tile(self, p: GemmProblem) -> dict:
        if p.m >= 256 and ceil_div(p.m, 256) * ceil_div(p.n, 256) * p.l >= self.num_sms // 2:
            return dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2)
        return dict(tile_m=128, tile_n=128)


POLICIES = {
    "sm_90a": Sm90Policy("sm_90a", num_sms=132, smem_bytes=232448),
    "sm_100a": Sm100Policy("sm_100a", num_sms=148, smem_bytes=232448),
}


def policy_for(arch: str, num_sms: int | None = None) -> ArchPolicy:
    pol = POLICIES[arch]
    return replace(pol, num_sms=num_sms) if num_sms else pol
