"""Block-scaled (MXFP8 / MXFP4 / NVFP4) pieces of the sm_100a kernel: the block-scaled tiled MMA,
scale-factor TMA loads into shared memory, their copy to TMEM (tcgen05.cp) and the block-scaled
MMA loop. A part of ``cutegemm.gemm.sm100.kernel.GemmSm100``; every call site is behind
``const_expr(self.blockscaled)``, so dense kernels compile exactly as without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.tensor_utils import LayoutEnum

SF_ATOM_MN = 32  # a scale-factor TMEM column group holds 32 rows x 4 K-blocks
TMEM_COLUMNS = 512


@dataclass(frozen=True)
class TmemPlan:
    """Where a block-scaled kernel's accumulators and scale factors live in its TMEM columns.

    Two accumulators and the scales fit: two stages side by side (``overlap_cols == 0``), the
    epilogue of tile i overlaps the mainloop of tile i + 1. They do not fit (tile_n = 256: 2 x 256
    accumulator columns + the scales > 512), but one accumulator and the scales leave room: two
    *overlapping* buffers behind a one-stage accumulator pipeline (NVIDIA's ``overlapping_accum``).
    Buffer 0 holds columns [0, acc_cols), buffer 1 [stage_cols, stage_cols + acc_cols), the
    scales the columns after it; the two share ``overlap_cols`` columns, buffer 0's last and
    buffer 1's first. Tiles alternate buffers (buffer = the pipeline phase); the epilogue reads
    the shared columns first (buffer 0 from its last subtile back, buffer 1 from its first) and
    releases the stage as soon as it has read them, so the next tile's MMAs start while the
    epilogue still reads the rest. The tile after next uses the same buffer as this one; its MMAs
    wait for the next tile's release, which comes after this epilogue has read every column.
    """

    acc_stage: int  # stages of the accumulator pipeline
    buffers: int  # accumulator buffers (2 when overlapping)
    stage_cols: int  # column offset of buffer 1
    acc_span: int  # columns before the scale factors
    overlap_cols: int  # columns the two buffers share (0: none)
    alloc_cols: int  # tcgen05.alloc size (a power of two >= 32)

    def release_after(self, epi_cols: int, epi_m_tiles: int, num_epi: int) -> int:
        """Index (in the epilogue's read order) of the subtile after whose TMEM load the stage is
        released. Subtiles of ``epi_cols`` columns are read M-fastest (index = m + epi_m_tiles * n);
        with overlapping buffers the first epi_m_tiles * ceil(overlap / epi_cols) of them cover
        the shared columns, else the stage is released after the last."""
        if not self.overlap_cols:
            return num_epi - 1
        return min(num_epi, int(epi_m_tiles) * -(-self.overlap_cols // int(epi_cols))) - 1


def tmem_plan(acc_cols: int, sf_cols: int, columns: int = TMEM_COLUMNS) -> TmemPlan:
    """The TMEM plan of ``acc_cols`` accumulator columns per tile and ``sf_cols`` scale-factor
    columns (see :class:`TmemPlan`)."""

    def alloc(used: int) -> int:
        n = 32
        while n < used:
            n *= 2
        return n

    if 2 * acc_cols + sf_cols <= columns:
        return TmemPlan(2, 2, acc_cols, 2 * acc_cols, 0, alloc(2 * acc_cols + sf_cols))
    if acc_cols + sf_cols >= columns:
        raise ValueError(f"{acc_cols} accumulator + {sf_cols} scale-factor TMEM columns exceed {columns}")
    stage_cols = columns - acc_cols - sf_cols
    return TmemPlan(1, 2, stage_cols, stage_cols + acc_cols, acc_cols - stage_cols, columns)


class BlockScaledMma:
    """Methods of GemmSm100 used only by block-scaled configs."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    def _setup_blockscaled_mma(self, a_layout: LayoutEnum, b_layout: LayoutEnum):
        """Block-scaled tiled MMA (kind::mxf8f6f4 / mxf4 / mxf4nvf4), and the 1-CTA MMA whose
        B-side partition says how the SFB tile is loaded: every CTA of a pair needs the scales of
        all tile_n columns (rounded up to 128, the SFB TMEM granule)."""
        cfg = self.k.config
        args = (self.k.a_dtype, self.k.b_dtype, a_layout.mma_major_mode(), b_layout.mma_major_mode(), self.k.sf_dtype, self.k.sf_vec)
        self.k.tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(*args, self.k.cta_group, self.k.mma_tiler_mn)
        self.k.mma_tiler_mn_sfb = (cfg.tile_m // self.k.cta_per_mma, cute.round_up(cfg.tile_n, 128))
        self.k.tiled_mma_sfb = sm100_utils.make_blockscaled_trivial_tiled_mma(
            *args, tcgen05.CtaGroup.ONE, self.k.mma_tiler_mn_sfb
        )
        inst_k = cute.size(self.k.tiled_mma.shape_mnk, mode=[2])
        self.k.mma_tiler_sfb = (*self.k.mma_tiler_mn_sfb, inst_k * 4)
        self.k.cluster_layout_sfb_vmnk = cute.tiled_divide(
            cute.make_layout((*self.k.cluster_shape_mn, 1)), (self.k.tiled_mma_sfb.thr_id.shape,)
        )

    def _setup_blockscaled_tmem(self, acc_cols: int):
        """TMEM columns: two accumulator buffers (side by side, or overlapping: ``TmemPlan``),
        then SFA, then SFB (one k-tile of scales each, rewritten by tcgen05.cp before every
        k-tile's MMAs)."""
        k_blocks = 4  # MMA instructions per k-tile
        self.k.num_sfa_tmem_cols = (self.k.cta_tile_mn[0] // SF_ATOM_MN) * k_blocks
        self.k.num_sfb_tmem_cols = (self.k.mma_tiler_mn_sfb[1] // SF_ATOM_MN) * k_blocks
        plan = tmem_plan(acc_cols, self.k.num_sfa_tmem_cols + self.k.num_sfb_tmem_cols)
        self.k.tmem = plan
        self.k.acc_stage = plan.acc_stage
        self.k.acc_overlap = plan.overlap_cols > 0
        self.k.num_acc_tmem_cols = plan.acc_span
        self.k.num_tmem_cols = plan.alloc_cols

    def overlapped_acc_layout(self, acc_layout: cute.Layout) -> cute.Layout:
        """The (MMA, MMA_M, MMA_N, 2) accumulator layout with buffer 1 ``stage_cols`` TMEM columns
        after buffer 0 (the N mode's column stride is one TMEM column)."""
        col = acc_layout.stride[0][1]
        stride = (*acc_layout.stride[:3], self.k.tmem.stage_cols * col)
        return cute.make_layout(acc_layout.shape, stride=stride)

    def _make_sf_tma(self, mA, mB, mSFA, mSFB, vmnk_shape):
        """TMA atoms of the scale factors. The swizzled 128x4 bytes are viewed in the scale-factor
        atom layout ((32,4),(vec,4)) tiled over A's (M, K, L) / B's (N, K, L) shape, so they are
        indexed by element coordinates and partitioned exactly like A and B. SFB is loaded per CTA
        for all of the MMA tile's columns (tiled_mma_sfb, 1-CTA)."""
        a_shape = mA.shape
        if cutlass.const_expr(self.k.config.grouped):
            # Grouped: A's scales are laid out per expert, each expert's rows from a new 128-row
            # block (``blockscaled.grouped_sf``): P padded rows, P = bytes / padded K blocks.
            kb_p = cute.round_up(cute.ceil_div(mA.shape[1], self.k.sf_vec), 4)
            a_shape = (cute.size(mSFA) // kb_p, mA.shape[1], 1)
        sfa = cute.make_tensor(mSFA.iterator, blockscaled_utils.tile_atom_to_shape_SF(a_shape, self.k.sf_vec))
        sfb = cute.make_tensor(mSFB.iterator, blockscaled_utils.tile_atom_to_shape_SF(mB.shape, self.k.sf_vec))
        sfa_one = cute.slice_(self.k.sfa_smem_layout_staged, (None, None, None, 0))
        sfb_one = cute.slice_(self.k.sfb_smem_layout_staged, (None, None, None, 0))
        tma_atom_sfa, tma_tensor_sfa = cute.nvgpu.make_tiled_tma_atom_A(
            sm100_utils.cluster_shape_to_tma_atom_A(self.k.cluster_shape_mn, self.k.tiled_mma.thr_id),
            sfa,
            sfa_one,
            self.k.mma_tiler,
            self.k.tiled_mma,
            vmnk_shape,
            internal_type=cutlass.Int16,
        )
        tma_atom_sfb, tma_tensor_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_SFB(self.k.cluster_shape_mn, self.k.tiled_mma.thr_id),
            sfb,
            sfb_one,
            self.k.mma_tiler_sfb,
            self.k.tiled_mma_sfb,
            self.k.cluster_layout_sfb_vmnk.shape,
            internal_type=cutlass.Int16,
        )
        if cutlass.const_expr(self.k.config.tile_n == 192):
            # SFB tiles are 256 columns (two 128-column granules) but consecutive MMA tiles start
            # 192 columns apart: tile n loads the granules from 128 * floor(1.5 n); an odd tile's
            # scales then start 64 columns in (the MMA shifts its SFB TMEM address, see
            # mma_blockscaled).
            x = tma_tensor_sfb.stride[0][1]
            y = cute.ceil_div(tma_tensor_sfb.shape[0][1], 4)
            shape = ((tma_tensor_sfb.shape[0][0], ((2, 2), y)), tma_tensor_sfb.shape[1], tma_tensor_sfb.shape[2])
            x3 = 3 * x  # ScaledBasis: multiply from the left
            stride = ((tma_tensor_sfb.stride[0][0], ((x, x), x3)), tma_tensor_sfb.stride[1], tma_tensor_sfb.stride[2])
            tma_tensor_sfb = cute.make_tensor(tma_tensor_sfb.iterator, cute.make_layout(shape, stride=stride))
        return (
            tma_atom_sfa, tma_tensor_sfa, tma_atom_sfb, tma_tensor_sfb,
            self.k.tiled_mma_sfb, self.k.cluster_layout_sfb_vmnk,
            self.k.sfa_smem_layout_staged, self.k.sfb_smem_layout_staged,
        )  # fmt: skip

    @cute.jit
    def partition_sf(
        self,
        storage,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        tiled_mma_sfb: cute.TiledMma,
        cluster_layout_vmnk: cute.Layout,
        cluster_layout_sfb_vmnk: cute.Layout,
        cluster_coord_vmnk,
        cta_rank_in_cluster: cutlass.Int32,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        thr_mma,
        mma_coord_v: cutlass.Int32,
    ):
        """Scale-factor smem stages and their TMA partitions (as A/B: SFA multicast along the
        cluster row, SFB along the cluster column of the 1-CTA SFB layout)."""
        # (MMA, MMA_M, MMA_K, STAGE), (MMA, MMA_N, MMA_K, STAGE)
        sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
        sSFB = storage.sSFB.get_tensor(sfb_smem_layout_staged)
        cluster_coord_sfb_vmnk = cluster_layout_sfb_vmnk.get_flat_coord(cta_rank_in_cluster)
        sfa_mcast_mask = None
        sfb_mcast_mask = None
        if cutlass.const_expr(self.k.is_a_mcast or self.k.is_b_mcast or self.k.use_2cta):
            sfa_mcast_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, cluster_coord_vmnk, mcast_mode=2)
            sfb_mcast_mask = cpasync.create_tma_multicast_mask(
                cluster_layout_sfb_vmnk, cluster_coord_sfb_vmnk, mcast_mode=1
            )
        # (bM, bK, RestM, RestK, RestL), (bN, bK, RestN, RestK, RestL)
        gSFA = cute.local_tile(mSFA_mkl, cute.slice_(self.k.mma_tiler, (None, 0, None)), (None, None, None))
        gSFB = cute.local_tile(mSFB_nkl, cute.slice_(self.k.mma_tiler_sfb, (0, None, None)), (None, None, None))
        tCgSFA = thr_mma.partition_A(gSFA)
        tCgSFB = tiled_mma_sfb.get_slice(mma_coord_v).partition_B(gSFB)
        # (TMA, STAGE), (TMA, RestM, RestK, RestL)
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom_sfa,
            cluster_coord_vmnk[2],
            cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape),
            cute.group_modes(sSFA, 0, 3),
            cute.group_modes(tCgSFA, 0, 3),
        )
        # (TMA, STAGE), (TMA, RestN, RestK, RestL)
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom_sfb,
            cluster_coord_sfb_vmnk[1],
            cute.make_layout(cute.slice_(cluster_layout_sfb_vmnk, (0, None, 0, 0)).shape),
            cute.group_modes(sSFB, 0, 3),
            cute.group_modes(tCgSFB, 0, 3),
        )
        return {
            "sSFA": sSFA,
            "sSFB": sSFB,
            "tAsSFA": cute.filter_zeros(tAsSFA),
            "tAgSFA": cute.filter_zeros(tAgSFA),
            "tBsSFB": cute.filter_zeros(tBsSFB),
            "tBgSFB": cute.filter_zeros(tBgSFB),
            "sfa_mcast_mask": sfa_mcast_mask,
            "sfb_mcast_mask": sfb_mcast_mask,
            "sfa_smem_layout": cute.slice_(sfa_smem_layout_staged, (None, None, None, 0)),
            "sfb_smem_layout": cute.slice_(sfb_smem_layout_staged, (None, None, None, 0)),
        }

    def sf_load_operands(self, tma_atom_sfa: cute.CopyAtom, tma_atom_sfb: cute.CopyAtom, sf, sfa_block=None):
        """The scale factors as ``GemmBase.load_ab`` extra operands: SFA follows A's m-tile, SFB
        B's n-tile (SFB tiles are 128 columns: two 64-column MMA tiles share one). Grouped:
        ``sfa_block(tile)`` is the tile's 128-row block of the per-expert padded SFA layout (one
        L), SFB's L mode is the expert (tile[2])."""
        tAgSFA, tBgSFB = sf["tAgSFA"], sf["tBgSFB"]
        halve_n = self.k.config.tile_n == 64

        def sfa_tiles(tile):
            if cutlass.const_expr(sfa_block is not None):
                return tAgSFA[(None, sfa_block(tile), None, 0)]
            return tAgSFA[(None, tile[0], None, tile[2])]

        def sfb_tiles(tile):
            return tBgSFB[(None, tile[1] // 2 if halve_n else tile[1], None, tile[2])]

        return (
            (tma_atom_sfa, sfa_tiles, sf["tAsSFA"], sf["sfa_mcast_mask"]),
            (tma_atom_sfb, sfb_tiles, sf["tBsSFB"], sf["sfb_mcast_mask"]),
        )

    def s2t_copy(self, sSF: cute.Tensor, tSF: cute.Tensor):
        """tcgen05.cp (4x32dp128bit) of a scale-factor stage SMEM -> TMEM: (tiled copy, source
        smem descriptors (.., STAGE), TMEM destination)."""
        # (MMA, MMA_MN, MMA_K, STAGE), (MMA, MMA_MN, MMA_K)
        sSF_compact = cute.filter_zeros(sSF)
        tSF_compact = cute.filter_zeros(tSF)
        tiled_copy = tcgen05.make_s2t_copy(
            cute.make_copy_atom(tcgen05.Cp4x32x128bOp(self.k.cta_group), self.k.sf_dtype), tSF_compact
        )
        thr_copy = tiled_copy.get_slice(0)
        src = tcgen05.get_s2t_smem_desc_tensor(tiled_copy, thr_copy.partition_S(sSF_compact))
        return tiled_copy, src, thr_copy.partition_D(tSF_compact)

    @cute.jit
    def mma_blockscaled(
        self,
        sched,
        ab_pipeline: pipeline.PipelineAsync,
        acc_pipeline: pipeline.PipelineAsync,
        tmem: memory.TmemAllocator,
        tiled_mma: cute.TiledMma,
        acc_layout: cute.Layout,  # (MMA, MMA_M, MMA_N, ACC_STAGE)
        sA: cute.Tensor,
        sB: cute.Tensor,
        k_tile_cnt: cutlass.Int32,
        is_leader_cta: cutlass.Boolean,
        sf,
    ):
        """MMA warp of the block-scaled kernel (see ``mma``). Before a k-tile's MMAs, tcgen05.cp
        copies its SFA/SFB stage SMEM -> TMEM (columns after the accumulators), where the MMAs
        read them; tcgen05.cp and tcgen05.mma of one thread run in issue order, so one TMEM copy
        of the scales is enough."""
        # (MMA, MMA_M, MMA_K, STAGE), (MMA, MMA_N, MMA_K, STAGE): smem descriptors
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        tmem.wait_for_alloc()
        acc_ptr = tmem.retrieve_ptr(self.k.acc_dtype)
        # (MMA, MMA_M, MMA_N, ACC_STAGE)
        tCtAcc_base = cute.make_tensor(acc_ptr, acc_layout)
        # (MMA, MMA_M, MMA_K), (MMA, MMA_N, MMA_K): scale factors in TMEM
        sfa_ptr = cute.recast_ptr(acc_ptr + self.k.num_acc_tmem_cols, dtype=self.k.sf_dtype)
        tCtSFA = cute.make_tensor(
            sfa_ptr,
            blockscaled_utils.make_tmem_layout_sfa(tiled_mma, self.k.mma_tiler, self.k.sf_vec, sf["sfa_smem_layout"]),
        )
        sfb_col = acc_ptr + self.k.num_acc_tmem_cols + self.k.num_sfa_tmem_cols
        tCtSFB_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma, self.k.mma_tiler, self.k.sf_vec, sf["sfb_smem_layout"]
        )
        tCtSFB = cute.make_tensor(cute.recast_ptr(sfb_col, dtype=self.k.sf_dtype), tCtSFB_layout)
        copy_sfa, tCsSFA_s2t, tCtSFA_s2t = self.s2t_copy(sf["sSFA"], tCtSFA)
        copy_sfb, tCsSFB_s2t, tCtSFB_s2t = self.s2t_copy(sf["sSFB"], tCtSFB)

        ab_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.k.ab_stage)
        acc_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.k.acc_stage)
        work = sched.first()
        while sched.is_valid(work):
            # (MMA, MMA_M, MMA_N)
            acc_buf = acc_producer_state.index
            if cutlass.const_expr(self.k.acc_overlap):
                # One pipeline stage, two overlapping buffers: tiles alternate (the producer's
                # phase starts at 1).
                acc_buf = acc_producer_state.phase ^ 1
            tCtAcc = tCtAcc_base[(None, None, None, acc_buf)]
            tCtSFB_mma = tCtSFB
            if cutlass.const_expr(self.k.config.tile_n in (64, 192)):
                # An odd tile's scales start 64 columns into the loaded SFB granule: skip them
                # (2 TMEM columns of scale bytes).
                shift = cutlass.Int32((sched.cta_tile(work)[1] % 2) * 2)
                tCtSFB_mma = cute.make_tensor(cute.recast_ptr(sfb_col + shift, dtype=self.k.sf_dtype), tCtSFB_layout)
            if is_leader_cta:
                acc_pipeline.producer_acquire(acc_producer_state)
            for k_tile in cutlass.range(k_tile_cnt, unroll=1):
                if is_leader_cta:
                    ab_pipeline.consumer_wait(ab_consumer_state)
                    s2t_coord = (None, None, None, None, ab_consumer_state.index)
                    cute.copy(copy_sfa, tCsSFA_s2t[s2t_coord], tCtSFA_s2t)
                    cute.copy(copy_sfb, tCsSFB_s2t[s2t_coord], tCtSFB_s2t)
                    # The first k-tile of a tile overwrites the accumulator; cute.gemm runs the
                    # k-tile's MMA instructions, accumulating after its first.
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, k_tile != 0)
                    coord = (None, None, None, ab_consumer_state.index)
                    cute.gemm(tiled_mma, tCtAcc, [tCrA[coord], tCtSFA], [tCrB[coord], tCtSFB_mma], tCtAcc)
                    ab_pipeline.consumer_release(ab_consumer_state)
                ab_consumer_state.advance()
            if is_leader_cta:
                acc_pipeline.producer_commit(acc_producer_state)
            acc_producer_state.advance()
            work = sched.next(work)
        acc_pipeline.producer_tail(acc_producer_state)

