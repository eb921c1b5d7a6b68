"""The shared part of every dense-family kernel: config -> DSL types, the persistent grid, and
the TMA producer role that feeds the A/B shared-memory ring (identical on sm_90a and sm_100a).

Arch subclasses (``sm90.GemmSm90``, ``sm100.GemmSm100``) add the MMA role (WGMMA with register
accumulators / tcgen05 with TMEM accumulators) and the way accumulators reach the epilogue. The
epilogue math itself is ``cutegemm.epilogue.apply_epilogue`` for both.
"""

from __future__ import annotations

import inspect

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync

from ..config import GRID_Z_MAX, GemmConfig, config_errors
from ..runtime.dtypes import CUTLASS_DTYPES
from ..schedulers.dynamic import BroadcastScheduler, SchedulerRing, clc_grid_clusters
from ..schedulers.static import StaticPersistentScheduler, persistent_grid
from .grouped_parts import launch_list_descriptors


class GemmBase:
    """Base of the dense kernels: holds the config, the scheduler choice and the load role."""

    def __init__(self, config: GemmConfig):
        err = config_errors(config)
        if err:
            raise ValueError(f"invalid GemmConfig {config}: {'; '.join(err)}")
        self.config = config
        self.a_dtype = CUTLASS_DTYPES[config.a_dtype]
        self.b_dtype = CUTLASS_DTYPES[config.b_dtype]
        self.c_dtype = CUTLASS_DTYPES[config.out_dtype]
        self.acc_dtype = cutlass.Float32
        self.cluster_shape_mn = (config.cluster_m, config.cluster_n)
        self.num_mcast_ctas_a = config.cluster_n  # A tile is shared by the CTAs of one cluster row
        self.num_mcast_ctas_b = config.cluster_m
        self.is_a_mcast = self.num_mcast_ctas_a > 1
        self.is_b_mcast = self.num_mcast_ctas_b > 1

    def check_smem_size(self, size: int, capacity: int) -> None:
        """At trace time (so compile-check catches it on a machine without a GPU): the kernel's
        shared storage must fit the SM; CUDA would refuse the launch without saying why."""
        if size > capacity:
            raise ValueError(
                f"{self.config.name}: {size} B of shared memory > {capacity} "
                f"({self.ab_stage} A/B stages, {self.epi_stage} epilogue buffers)"
            )

    # -- scheduling (arch-neutral) -------------------------------------------------------------
    def make_scheduler(
        self, mC_mnl: cute.Tensor, cta_tile_mn, ctas_per_tile_m: int = 1
    ) -> StaticPersistentScheduler:
        """``ctas_per_tile_m=2``: a CTA pair shares one MMA tile (sm_100 2-CTA); the scheduler then
        hands out that tile's coordinates (see ``StaticPersistentScheduler.create``)."""
        return StaticPersistentScheduler.create(
            (mC_mnl.shape[0], mC_mnl.shape[1], mC_mnl.shape[2]),
            cta_tile_mn,
            self.cluster_shape_mn,
            self.config.group,
            self.config.raster == "m",
            ctas_per_tile_m,
            self.config.split_k,
            self.config.split_tail,
        )

    @staticmethod
    def unflatten(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
        """flat configs: A (M, K), B (K, N), C (M, N) as torch holds them -> the kernel's
        (M, K, 1), (N, K, 1), (M, N, 1). The unit L mode gets a 16-byte stride (TMA checks every
        stride, used or not), as the host's views of batched launches do."""

        def with_l(t, order):
            shape = (*(t.shape[i] for i in order), 1)
            stride = (*(t.stride[i] for i in order), 128 // t.element_type.width)
            return cute.make_tensor(t.iterator, cute.make_layout(shape, stride=stride))

        return with_l(mA, (0, 1)), with_l(mB, (1, 0)), with_l(mC, (0, 1))

    def grid(self, mC_mnl: cute.Tensor, cta_tile_mn, max_clusters, mOffs=None, total_m=None):
        """Persistent grid (cluster_m, cluster_n, clusters). Grouped: the tile count lives on the
        device (offs), so every cluster slot is launched and finds its work from the table.
        CLC: one cluster per cluster tile (grouped: the upper bound of ``clc_grid_clusters``), laid
        out along x as (cluster_m * clusters, cluster_n, 1) (gridDim.z stops at 65535)."""
        if self.config.scheduler == "clc" and self.config.listed:
            # List form: the host passes its exact tile count as max_clusters (one cluster each).
            return (self.cluster_shape_mn[0] * max_clusters, self.cluster_shape_mn[1], 1)
        if self.config.scheduler == "clc":
            n_tiles = cute.ceil_div(mC_mnl.shape[1], cta_tile_mn[1] * self.cluster_shape_mn[1])
            if self.config.grouped:
                clusters = clc_grid_clusters(total_m, mOffs.shape[0], self.config.tile_m, n_tiles)
            else:
                m_tiles = cute.ceil_div(mC_mnl.shape[0], cta_tile_mn[0] * self.cluster_shape_mn[0])
                clusters = m_tiles * n_tiles * mC_mnl.shape[2]
            return (self.cluster_shape_mn[0] * clusters, self.cluster_shape_mn[1], 1)
        if self.config.grouped or self.config.listed:
            return (*self.cluster_shape_mn, max_clusters)
        if self.config.split_cluster:
            # one CTA per work unit (no persistent walk; can_implement keeps the units <= GRID_Z_MAX)
            max_clusters = GRID_Z_MAX
        return persistent_grid(
            (mC_mnl.shape[0], mC_mnl.shape[1], mC_mnl.shape[2]),
            cta_tile_mn,
            self.cluster_shape_mn,
            max_clusters,
            self.config.split_k,
            self.config.split_tail,
        )

    def launch_list_prep(self, tma_atoms, mTable, stream):
        """List form, in the host ``__call__`` before the GEMM: the prep kernel that writes every
        group's A, B, C descriptors from the group table (``mTable``, the offs argument), on the
        GEMM's stream. ``tma_atoms``: the launch's (A, B, C) atoms, the templates."""
        unit_modes = (1 if self.config.a_major == "k" else 0, 1 if self.config.b_major == "k" else 0, 1)
        launch_list_descriptors(tma_atoms, mTable, (self.a_dtype, self.b_dtype, self.c_dtype), unit_modes, stream)

    def broadcast_scheduler(self, inner, storage, mWorkspace) -> BroadcastScheduler:
        """scheduler "dynamic" / "clc": ``inner`` (static or grouped) behind the shared-memory
        ring of ``schedulers.dynamic`` (its barriers were initialised by :meth:`init_sched_ring`).
        The load role uses ``.as_fetcher(cta_rank_in_cluster == 0)``."""
        counter = mWorkspace.iterator if self.config.scheduler == "dynamic" else None
        return BroadcastScheduler(
            inner, SchedulerRing(storage), self.config.scheduler, self.cluster_shape_mn, counter
        )

    def init_sched_ring(self, storage, consumer_warps_per_cta: int, tidx):
        """Before ``pipeline_init_arrive``: the ring's mbarriers (dynamic schedulers only)."""
        if self.config.scheduler != "static":
            SchedulerRing(storage).init(
                consumer_warps_per_cta, self.cluster_shape_mn[0] * self.cluster_shape_mn[1], tidx
            )

    # -- producer role (arch-neutral) ----------------------------------------------------------
    @cute.jit
    def load_ab(
        self,
        sched: StaticPersistentScheduler,
        ab_pipeline: pipeline.PipelineAsync,
        k_tile_cnt,  # Int32, or tile -> Int32 (K-grouped: each expert's own K range)
        tma_atom_a: cute.CopyAtom,
        tAgA,  # (TMA, RestM, RestK, RestL), or tile -> (TMA, RestK)
        tAsA: cute.Tensor,  # (TMA, STAGE)
        a_mcast_mask,
        tma_atom_b: cute.CopyAtom,
        tBgB,  # (TMA, RestN, RestK, RestL), or tile -> (TMA, RestK)
        tBsB: cute.Tensor,  # (TMA, STAGE)
        b_mcast_mask,
        extra=(),
        descs=None,  # listed: tile -> (A descriptor, B descriptor) of its group
        tx_bytes=None,  # tile -> the bytes every stage of the tile receives (default: the pipeline's)
        k_first=None,  # split K: tile -> its first K tile (default 0)
    ):
        """One elected thread: TMA A and B k-tiles of every scheduled tile into the stage ring.

        ``extra``: more operands loaded on the same stage barrier (block-scaled: the scale
        factors), each ``(tma_atom, tile -> (TMA, RestK), smem (TMA, STAGE), mcast_mask)``, or
        with a fifth member ``tile -> Boolean``: whether the tile loads that operand at all
        (``tx_bytes`` must then count only the loaded ones, those multicast by peers included).
        """
        producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stage)
        work = sched.first()
        while sched.is_valid(work):
            tile = sched.cta_tile(work)
            # (TMA, RestK). A may be given as a function of the tile (grouped: rows start at the
            # expert's first row, not at a multiple of the tile).
            if cutlass.const_expr(inspect.isfunction(tAgA)):
                tAgA_k = tAgA(tile)  # sm_100a gather_a: (coordinates, indices) of the gather4 loads
            else:
                tAgA_k = tAgA[(None, tile[0], None, tile[2])]
            tBgB_k = None  # tma_atom_b None: B comes as extra operands (swap_ab's token chunks)
            if cutlass.const_expr(tma_atom_b is not None):
                tBgB_k = tBgB(tile) if cutlass.const_expr(inspect.isfunction(tBgB)) else tBgB[(None, tile[1], None, tile[2])]
            extra_k = [op[1](tile) for op in extra]  # (TMA, RestK) per extra operand
            extra_live = [op[4](tile) if len(op) > 4 else True for op in extra]
            tile_tx = tx_bytes(tile) if cutlass.const_expr(tx_bytes is not None) else None
            kt_cnt = k_tile_cnt(tile) if cutlass.const_expr(inspect.isfunction(k_tile_cnt)) else k_tile_cnt
            desc_a = desc_b = None
            if cutlass.const_expr(descs is not None):
                desc_a, desc_b = descs(tile)
                cpasync.fence_tma_desc_acquire(desc_a)
                cpasync.fence_tma_desc_acquire(desc_b)
            k0 = k_first(tile) if cutlass.const_expr(k_first is not None) else None
            for k_tile in range(kt_cnt):
                kc = k_tile if cutlass.const_expr(k_first is None) else k_tile + k0
                full_bar = ab_pipeline.producer_get_barrier(producer_state)
                if cutlass.const_expr(tx_bytes is None):
                    ab_pipeline.producer_acquire(producer_state)
                elif cutlass.const_expr(isinstance(ab_pipeline, pipeline.PipelineTmaUmma)):
                    # sm_100a: the pipeline arms the full barrier on the leader CTA only (2-CTA: the
                    # pair's bytes land on the leader's barrier), with this tile's byte count
                    ab_pipeline.producer_acquire(producer_state, expected_tx=tile_tx)
                else:  # producer_acquire with this tile's byte count (every CTA arms its own barrier)
                    ab_pipeline.sync_object_empty.wait(producer_state.index, producer_state.phase)
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(full_bar, tile_tx)
                cute.copy(
                    tma_atom_a,
                    [t[(None, kc)] for t in tAgA_k] if cutlass.const_expr(isinstance(tAgA_k, tuple)) else tAgA_k[(None, kc)],
                    tAsA[(None, producer_state.index)],
                    tma_bar_ptr=full_bar,
                    mcast_mask=a_mcast_mask,
                    tma_desc_ptr=desc_a,
                )
                if cutlass.const_expr(tma_atom_b is not None):
                    cute.copy(
                        tma_atom_b,
                        tBgB_k[(None, kc)],
                        tBsB[(None, producer_state.index)],
                        tma_bar_ptr=full_bar,
                        mcast_mask=b_mcast_mask,
                        tma_desc_ptr=desc_b,
                    )
                for i in cutlass.range_constexpr(len(extra)):
                    atom, _, smem, mask = extra[i][:4]
                    if extra_live[i]:
                        cute.copy(
                            atom,
                            extra_k[i][(None, k_tile)],
                            smem[(None, producer_state.index)],
                            tma_bar_ptr=full_bar,
                            mcast_mask=mask,
                        )
                ab_pipeline.producer_commit(producer_state)
                producer_state.advance()
            work = sched.next(work)
        sched.finish(work)
        # Do not exit while peers in the cluster may still signal our empty barriers.
        ab_pipeline.producer_tail(producer_state)
