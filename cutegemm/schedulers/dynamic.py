"""Dynamic persistent schedulers: the next tile is decided at run time, so the roles of a CTA (and
the CTAs of a cluster) no longer agree on it by construction; one warp fetches it and broadcasts
it to every role through a small shared-memory ring.

Two fetch modes, one ring protocol (:class:`BroadcastScheduler`):

- ``"dynamic"`` (sm_90a and sm_100a; the Hopper stand-in for CLC): cluster c starts with cluster
  tile c (``blockIdx.z``); every further tile is ``gridDim.z + atomicAdd(counter, 1)`` on a global
  Int32 counter, so clusters that finish early take more work. A fetched index >= the tile count
  means "no more work". The counter is one Int32 of the plan's workspace, zeroed when it is made;
  every launch leaves it at 0 again, with no host reset (no memset launch per call): each
  cluster whose first tile is real fetches once per tile it runs, the last fetch saying "done",
  so a launch hands out exactly ``total`` tickets (total - min(total, clusters) tiles, one "done"
  per working cluster), and the fetcher that draws ticket total - 1 (the last atomic on the
  counter in this launch) sets it back to 0. The next launch on the stream, or a CUDA graph's
  next replay, starts from 0.
- ``"clc"`` (sm_100a): the grid *is* the work queue: one cluster per cluster tile (grouped: an
  upper bound, see :func:`clc_grid_clusters`; the grid is ``(cluster_m * clusters, cluster_n, 1)``
  so it can exceed gridDim.z's 65535). ``clusterlaunchcontrol.try_cancel`` cancels a not yet
  started cluster and multicasts a 16-byte response to every CTA of the cluster; its first ctaid
  x / cluster_m is the tile. Rules (see shared/LESSONS.md):
  * an invalid response ends *this* cluster's loop and nothing else: no further query is issued
    after it (undefined behaviour), its coordinates are never used, and nothing is "drained" on
    it; clusters that were not cancelled still start and run their own tile;
  * a valid grant that decodes to a padding tile (>= the real tile count, grouped) is skipped by
    every role and the next response is consumed: padding is drained one observed query at a
    time, never in bulk;
  * at most one query is in flight, and the fetcher waits for every response it asked for
    before it exits (no query in flight at CTA exit);
  * every role reads a response slot before it releases it (generic-proxy read, then a proxy
    fence, then the release), so the next query cannot overwrite it early.

Ring protocol (``depth`` slots of 16 bytes, a "full" and an "empty" mbarrier each):

- the fetcher is one whole warp, the load warp of cluster rank 0. For slot s it waits ``empty[s]``
  (its own CTA's barrier: every consumer warp of every CTA of the cluster arrives there), lane r
  arms ``full[s]`` of CTA r with the slot's byte count, then the query fills every CTA's slot
  (CLC: the multicast response; dynamic: lane 0's atomic, ``st.async`` by lane r into CTA r).
  Dynamic with a 1-CTA cluster: no ``st.async`` (it needs a cluster of >= 2 CTAs); lane 0 writes
  the slot with a plain shared store and then arrives on ``full[s]`` (no tx bytes armed);
- every consuming warp (the fetcher included) waits ``full[s]``, reads the slot, fences, and one
  lane arrives on rank 0's ``empty[s]``. The fetcher asks for slot s + 1 right after consuming
  slot s (one tile of lookahead), unless slot s said "done";
- the work handle (:class:`Work`) carries (tile, slot, phase) through the roles' loops; tile -1
  is "done". Every role consumes the same slots in the same order, so all agree.

Consumers of the protocol: ``first()``, ``next(work)``, ``is_valid(work)``, ``cta_tile(work)``
(as every scheduler) and ``finish(work)`` after the loop (the fetcher's tail). The tile -> (m, n, l)
or (expert, m, n) map is the wrapped static / grouped scheduler's. Cooperative schedules only
(sm_90a pingpong alternates tiles between warpgroups by position, see config_errors).

:func:`simulate_dynamic` and :func:`simulate_clc` are the plain-Python twins of the hand-out
rules used by the CPU property tests.
"""

from __future__ import annotations

import copy
import random

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values

SLOT_INT32 = 4  # a slot is 16 bytes (the CLC response); the dynamic mode uses its first Int32
RING_DEPTH = 4


class Work:
    """Loop-carried work handle: ``tile`` (linear cluster tile, -1 = done) and the ring slot
    (``index``, ``phase``) the next tile will be read from."""

    def __init__(self, tile, index, phase):
        self.tile = tile
        self.index = index
        self.phase = phase

    def __extract_mlir_values__(self):
        return extract_mlir_values([self.tile, self.index, self.phase])

    def __new_from_mlir_values__(self, values):
        tile, index, phase = new_from_mlir_values([self.tile, self.index, self.phase], values)
        return Work(tile, index, phase)


class SchedulerRing:
    """Shared-memory pieces of the ring: ``depth`` 16-byte slots plus full/empty mbarriers.

    SharedStorage members (see :func:`ring_storage_fields`): ``sched_resp`` (Int32, 4 per slot,
    16-byte aligned), ``sched_full`` and ``sched_empty`` (Int64 mbarriers, one per slot)."""

    def __init__(self, storage, depth: int = RING_DEPTH):
        self.resp = storage.sched_resp.data_ptr()
        self.full = storage.sched_full.data_ptr()
        self.empty = storage.sched_empty.data_ptr()
        self.depth = depth

    @cute.jit
    def init(self, consumer_warps_per_cta: cutlass.Constexpr, cluster_size: cutlass.Constexpr, tidx):
        """One thread initialises the barriers; call before ``pipeline_init_arrive`` (which
        fences the inits and syncs the cluster)."""
        if tidx == 0:
            for s in cutlass.range_constexpr(self.depth):
                cute.arch.mbarrier_init(self.full + s, 1)
                cute.arch.mbarrier_init(self.empty + s, consumer_warps_per_cta * cluster_size)

    def slot(self, index):
        """16-byte aligned pointer to slot ``index`` (the CLC response is read as one 128-bit load)."""
        addr = (self.resp + index * SLOT_INT32).toint()
        return cute.make_ptr(cutlass.Int32, addr, cute.AddressSpace.smem, assumed_align=16)


def ring_storage_fields(depth: int = RING_DEPTH) -> dict:
    """SharedStorage members of the ring (add them to a kernel's struct)."""
    MemRange, Align = cute.struct.MemRange, cute.struct.Align
    return {
        "sched_full": MemRange[cutlass.Int64, depth],
        "sched_empty": MemRange[cutlass.Int64, depth],
        "sched_resp": Align[MemRange[cutlass.Int32, SLOT_INT32 * depth], 16],
    }


class BroadcastScheduler:
    """Device side. ``inner``: the static or grouped scheduler that maps a linear cluster tile to
    this CTA's tile (``cta_tile``) and knows the real tile count (``total``).

    Compile-time: ``mode`` ("dynamic" | "clc"), ``cluster_size``, ``cluster_m``, the ring and
    whether this role fetches (``fetcher``: False, or a runtime Boolean: load warp of rank 0).
    """

    def __init__(self, inner, ring: SchedulerRing, mode: str, cluster_shape_mn, counter=None, fetcher=False):
        self.inner = inner
        self.ring = ring
        self.mode = mode
        self.cluster_m = cluster_shape_mn[0]
        self.cluster_size = cluster_shape_mn[0] * cluster_shape_mn[1]
        self.counter = counter  # dynamic: Int32 pointer in global memory
        self.fetcher = fetcher
        bx, _, bz = cute.arch.block_idx()
        _, _, gz = cute.arch.grid_dim()
        if mode == "clc":
            self.own = cutlass.Int32(bx) // self.cluster_m  # grid (cluster_m * clusters, cluster_n, 1)
        else:
            self.own = cutlass.Int32(bz)
        self.num_clusters = cutlass.Int32(gz)
        self.total = inner.total

    # DSL protocol: the runtime values travel through the roles' loops; pointers and compile-time
    # settings are kept by a shallow copy (as in ``PersistentWalk``).
    def _runtime(self):
        vals = [self.own, self.num_clusters, self.total]
        return vals + ([self.fetcher] if self.fetcher is not False else [])

    def __extract_mlir_values__(self):
        return extract_mlir_values(self._runtime()) + extract_mlir_values(self.inner)

    def __new_from_mlir_values__(self, values):
        mine = self._runtime()
        n = len(extract_mlir_values(mine))
        new = copy.copy(self)
        restored = new_from_mlir_values(mine, values[:n])
        new.own, new.num_clusters, new.total = restored[:3]
        if self.fetcher is not False:
            new.fetcher = restored[3]
        new.inner = new_from_mlir_values(self.inner, values[n:])
        return new

    def as_fetcher(self, is_fetcher) -> BroadcastScheduler:
        """The same scheduler for the role that fetches (``is_fetcher``: runtime Boolean, true in
        exactly one warp of the cluster)."""
        new = copy.copy(self)
        new.fetcher = cutlass.Boolean(is_fetcher)
        return new

    # -- protocol ------------------------------------------------------------------------------
    @cute.jit
    def first(self):
        tile = self.own
        if cutlass.const_expr(self.mode == "dynamic"):
            if tile >= self.total:
                tile = cutlass.Int32(-1)
        if cutlass.const_expr(self.fetcher is not False):
            if self.fetcher and tile >= 0:
                self._issue(cutlass.Int32(0), cutlass.Int32(0))
        return self._settle(tile, cutlass.Int32(0), cutlass.Int32(0))

    @cute.jit
    def next(self, work: Work):
        tile, index, phase = self._consume(work.index, work.phase)
        return self._settle(tile, index, phase)

    def is_valid(self, work: Work):
        return work.tile >= 0

    def cta_tile(self, work: Work):
        return self.inner.cta_tile(work.tile)

    @cute.jit
    def finish(self, work: Work):
        """Fetcher only: wait until every slot it filled was released by every consumer of the
        cluster (their arrives are remote for peer CTAs: this CTA must outlive them)."""
        if cutlass.const_expr(self.fetcher is not False):
            if self.fetcher:
                index, phase = work.index, work.phase
                for _ in cutlass.range_constexpr(self.ring.depth):
                    cute.arch.mbarrier_wait(self.ring.empty + index, phase ^ 1)
                    index, phase = self._advance(index, phase)

    # -- ring ----------------------------------------------------------------------------------
    def _tx_bytes(self) -> int:
        return 16 if self.mode == "clc" else 4

    def _advance(self, index, phase):
        nxt = index + 1
        wrap = nxt == self.ring.depth
        return cutlass.select_(wrap, cutlass.Int32(0), nxt), cutlass.select_(wrap, phase ^ 1, phase)

    @cute.jit
    def _settle(self, tile, index, phase):
        """CLC: a valid grant past the real tile count is padding; consume the next response."""
        if cutlass.const_expr(self.mode == "clc"):
            while tile >= self.total:
                tile, index, phase = self._consume(index, phase)
        return Work(tile, index, phase)

    @cute.jit
    def _consume(self, index, phase):
        """Whole warp: wait for slot ``index``, decode it, release it; the fetcher then asks for
        the following slot unless this one said "done". Returns (tile, next index, next phase)."""
        cute.arch.mbarrier_wait(self.ring.full + index, phase)
        tile = cutlass.Int32(-1)
        if cutlass.const_expr(self.mode == "clc"):
            x, _, _, valid = cute.arch.clc_response(self.ring.slot(index))
            if valid != 0:
                tile = x // self.cluster_m
        else:
            fetched = cutlass.Int32(cute.make_tensor(self.ring.slot(index), cute.make_layout(1))[0])
            if fetched < self.total:
                tile = fetched
        # The read (generic proxy) is ordered before the next write of the slot (async proxy).
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()
        with cute.arch.elect_one():
            if cutlass.const_expr(self.cluster_size > 1):
                cute.arch.mbarrier_arrive(self.ring.empty + index, peer_cta_rank_in_cluster=0)
            else:
                cute.arch.mbarrier_arrive(self.ring.empty + index)
        index, phase = self._advance(index, phase)
        if cutlass.const_expr(self.fetcher is not False):
            if self.fetcher and tile >= 0:
                self._issue(index, phase)
        return tile, index, phase

    @cute.jit
    def _issue(self, index, phase):
        """Fetcher warp: fill slot ``index`` of every CTA of the cluster with the next tile."""
        lane = cute.arch.lane_idx()
        num_clusters, total = self.num_clusters, self.total  # outside the const_expr branches (MLIR dominance)
        local = self.mode == "dynamic" and self.cluster_size == 1  # compile-time
        cute.arch.mbarrier_wait(self.ring.empty + index, phase ^ 1)
        if cutlass.const_expr(not local):
            if lane < self.cluster_size:
                if cutlass.const_expr(self.cluster_size > 1):
                    cute.arch.mbarrier_arrive_and_expect_tx(self.ring.full + index, self._tx_bytes(), lane)
                else:
                    cute.arch.mbarrier_arrive_and_expect_tx(self.ring.full + index, self._tx_bytes())
        if cutlass.const_expr(self.mode == "clc"):
            with cute.arch.elect_one():
                cute.arch.issue_clc_query(
                    self.ring.full + index, self.ring.slot(index), multicast=self.cluster_size > 1
                )
        else:
            ticket = cutlass.Int32(0)
            if lane == 0:
                ticket = cutlass.Int32(
                    cute.arch.atomic_add(self.counter, cutlass.Int32(1), sem="relaxed", scope="gpu")
                )
                if ticket == total - 1:  # the launch's last ticket (see the module docstring): reset
                    cute.arch.atomic_exch(self.counter, cutlass.Int32(0), sem="relaxed", scope="gpu")
            tile = cute.arch.shuffle_sync(ticket, 0) + num_clusters
            if cutlass.const_expr(local):
                # 1-CTA cluster: st.async (shared::cluster) needs a cluster of >= 2 CTAs
                # (compute-sanitizer: "Invalid __shared__ write"). A plain st.shared, then a
                # plain arrive on full[s] (count 1; release at CTA scope orders the store
                # before it; the consumers' wait acquires): same slots, same phases.
                if lane == 0:
                    cute.arch.store(self.ring.slot(index), tile, ss="cta")
                    cute.arch.mbarrier_arrive(self.ring.full + index)
            else:
                if lane < self.cluster_size:
                    cute.arch.store_async_dsmem(self.ring.slot(index), tile, self.ring.full + index, lane)


# -- host side / plain-Python twins ------------------------------------------------------------
def clc_grid_clusters(total_m, num_groups, tile_m: int, n_cluster_tiles):
    """Grouped CLC grid: an upper bound on the cluster tiles of any offs (no device->host sync):
    sum_e ceil(rows_e / tile_m) <= ceil(total_m / tile_m) + E - 1 when sum_e rows_e <= total_m,
    i.e. for valid offs (non-decreasing, >= 0). Invalid offs may clamp into overlapping experts
    whose tiles exceed the bound: those past the grid are not computed (memory-safe; the output
    of invalid offs is undefined anyway). Works on ints and on DSL integers."""
    return ((total_m + tile_m - 1) // tile_m + num_groups - 1) * n_cluster_tiles


def simulate_dynamic(total: int, num_clusters: int, rng: random.Random, cost=None, counter: list | None = None):
    """Plain-Python twin of the "dynamic" hand-out: cluster c starts with tile c, then takes
    ``num_clusters + counter++`` whenever it finishes a tile, finishing order decided by per-tile
    costs (``cost(tile)``, default random); the fetch drawing ticket total - 1 resets the counter.
    Returns {cluster: [tiles]}; ``counter``: a one-element list holding the counter at the launch's
    start, left holding it at the end."""
    cost = cost or (lambda t: rng.random())
    counter_ = counter[0] if counter is not None else 0
    done = {c: [] for c in range(num_clusters)}
    clock = []  # (finish time, cluster, tile)
    for c in range(num_clusters):
        if c < total:
            clock.append((cost(c), c, c))
    while clock:
        clock.sort()
        t, c, tile = clock.pop(0)
        done[c].append(tile)
        ticket = counter_
        counter_ += 1
        if ticket == total - 1:
            counter_ = 0
        nxt = num_clusters + ticket
        if nxt < total:
            clock.append((t + cost(nxt), c, nxt))
    if counter is not None:
        counter[0] = counter_
    return done


def simulate_clc(real_total: int, grid_clusters: int, max_resident: int, rng: random.Random, p_invalid=0.0):
    """Plain-Python twin of the CLC rules. Clusters launch in id order while fewer than
    ``max_resident`` run; a running cluster processes its tile (skips it when >= ``real_total``:
    padding), then queries: the hardware cancels the lowest not-yet-started cluster and returns
    its id, or an invalid response when none is left; with probability ``p_invalid`` a response
    is spuriously invalid although clusters are pending (that cluster then exits; the pending
    ones launch later and run their own tile). Returns (processed tiles in order, padding
    decodes, queries)."""
    pending = list(range(grid_clusters))
    running = []  # [cluster id, current tile]
    processed, padding, queries = [], 0, 0
    while pending or running:
        while pending and len(running) < max_resident:
            c = pending.pop(0)
            running.append([c, c])
        i = rng.randrange(len(running))
        c, tile = running[i]
        if tile < real_total:
            processed.append(tile)
        else:
            padding += 1
        queries += 1
        if pending and rng.random() >= p_invalid:
            running[i][1] = pending.pop(0)  # cancelled: its tile now belongs to this cluster
        else:
            running.pop(i)  # invalid: exit, never query again, never use its coordinates
    return processed, padding, queries
