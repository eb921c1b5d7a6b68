"""Dense GEMM for Blackwell (sm_100a): persistent, warp-specialized, tcgen05 MMA, TMEM accumulators.

Pipeline (one CTA; a cluster of cluster_m x cluster_n CTAs shares A/B tiles by TMA multicast):

    warp 5 (load)              warp 4 (MMA)                    warps 0-3 (epilogue)
    -----------------------    ----------------------------    ---------------------------------
    for tile in scheduler:     for tile in scheduler:          allocate TMEM (warp 0)
      for k in K-tiles:          wait acc stage empty          for tile in scheduler:
        wait stage empty         for k in K-tiles:               wait acc stage full
        TMA A,B -> smem stage      wait stage full               per (epi_m x epi_n) subtile:
                                   tcgen05.mma -> TMEM acc         TMEM -> regs (tcgen05.ld)
                                   commit -> stage empty           [last subtile: acc stage empty]
                                 commit -> acc stage full          epilogue_subtile -> cast
                                                                   -> smem -> TMA store (ring of
                                                                      epi_stage buffers)
                                                               free TMEM

ab ring: ab_stage smem stages (PipelineTmaUmma: TMA tx-count "full", tcgen05.commit "empty").
acc ring: acc_stage (2 when 2 x tile_n fp32 columns fit in the 512 TMEM columns) accumulators in
TMEM (PipelineUmmaAsync), so the epilogue of tile i overlaps the mainloop of tile i+1 (block-scaled
tile_n = 256: two overlapping buffers, see below).

2-CTA mode (config.two_cta): tcgen05.mma.cta_group::2 computes one tile_m x tile_n MMA tile with a
CTA pair (cluster ranks 2j, 2j+1; the even one is the leader). Each CTA TMA-loads its half of A
(tile_m/2 rows) and its half of B (tile_n/2 rows) and signals the leader's barrier; only the
leader waits, issues the MMA and commits; both CTAs hold tile_m/2 accumulator rows in their own
TMEM and run the epilogue on them. The scheduler hands both CTAs the pair tile's coordinates
(``ctas_per_tile_m=2``).

Epilogue ops (``config.epilogue``, see ``cutegemm.epilogue.ops``): bias, beta * C and gated
activations need each accumulator element's global (m, n, l) coordinate; an identity tensor
goes through the accumulator's own path (thr_mma.partition_C -> epilogue tiles -> the
tcgen05.ld partition -> the r2s retile), so coordinates match the registers by construction.
C and bias are read from global memory per element. Gated (swiglu/geglu): the accumulator tile
is tile_m x tile_n GEMM columns, the output tile tile_m x tile_n/2; each gated value is written
to shared memory by coordinate and TMA-stored like any subtile.

Grouped (config.grouped, packed MoE form; 1-CTA only): A (total_M, K, 1), B (N, K, E), C
(total_M, N, 1), offs (E,) as ``mOffs``. Same protocol as sm90 (``cutegemm.gemm.grouped_parts``):
warp 0 builds the tile-start table in shared memory from offs, every role walks the
GroupedScheduler's (m_tile, n_tile, expert, row_start, row_end) tiles; A is TMA-loaded from the
expert's first row; the epilogue TMA-stores tiles whose rows all belong to the expert and stores
the others by predicated 16-byte copies from the staged subtile (rows < row_end, columns < N).

Block-scaled mode (config.sf_vec > 0: MXFP8 e4m3/e8m0/32, MXFP4 e2m1/e8m0/32, NVFP4 e2m1/e4m3/16;
dense, K-major A and B): the MMA is tcgen05.mma.kind::mxf8f6f4 / mxf4 / mxf4nvf4
(``make_blockscaled_trivial_tiled_mma``). The scale tensors mSFA / mSFB arrive as the raw bytes of
the 128x4 swizzled layout and are viewed in the scale-factor atom layout ((32,4),(vec,4)) tiled
over A's / B's shape, so they are TMA-loaded per k-tile into their own SMEM ring slots on the same
stage barrier as A/B (``load_ab_sf``). The MMA warp copies a stage's scales SMEM -> TMEM with
tcgen05.cp (4x32dp128bit) into columns after the accumulators, then issues the k-tile's MMAs
(``mma_blockscaled``). SFB is loaded per CTA for round_up(tile_n, 128) columns (a 1-CTA MMA
partition, as NVIDIA's example), so 2-CTA pairs each hold all of the tile's B scales. The
epilogue is the dense one (NVFP4's global scales ride in alpha). When two accumulators and the
scales do not fit in TMEM (tile_n = 256), the two accumulator buffers overlap behind a one-stage
pipeline and the epilogue releases the stage once it has read the shared columns
(``blockscaled.TmemPlan``), so the epilogue still overlaps the next tile's mainloop.

Scheduler (config.scheduler): "static"; "dynamic" (global atomic counter) or "clc"
(clusterlaunchcontrol.try_cancel, grid = every cluster tile, grouped: an upper bound): the load
warp of cluster rank 0 fetches each next tile and the load, MMA and epilogue warps of every CTA
read it from a shared-memory ring (``schedulers.dynamic``). Compile-verified only (no sm_100 GPU).

Roles: the load warp (``GemmBase.load_ab``), the MMA warp (``mma`` here, ``mma_blockscaled`` in
``blockscaled.gemm.sm100.blockscaled``), the epilogue warps (``sm100.epilogue.Sm100Epilogue``).

Constraints: see ``config.config_errors`` (tile_m 64/128, or 128/256 with two_cta; tile_n a
multiple of 32 up to 256; cluster <= 4, cluster_m even with two_cta; grouped: no two_cta).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.tensor_utils import LayoutEnum

from ...config import FP8_DTYPES
from ...epilogue.quant import quant_storage
from ...runtime.dtypes import SF_DTYPES
from ...schedulers.dynamic import ring_storage_fields
from ..base import GemmBase
from ..grouped_parts import (
    fill_tile_starts,
    from_row,
    launch_kgrouped_table,
    list_roles,
    list_tile_table,
    make_grouped_scheduler,
    make_list_scheduler,
    tile_table,
    tile_table_bytes,
    tile_table_len,
)
from .blockscaled import BlockScaledMma
from .epilogue import Sm100Epilogue
from .gather import gather_tma_atom, gathered_a_tiles, gathered_smem
from .mma import Sm100MmaWarp

SMEM_CAPACITY_SM100 = memory.get_smem_capacity_in_bytes("sm_100")
TMEM_COLUMNS = 512
MBAR_BYTES = 1024  # mbarriers, TMEM pointer slot and alignment padding before the 1 KiB-aligned sA
# Named barriers (0 is __syncthreads).
BAR_EPILOGUE = 1  # the 4 epilogue warps, around each smem subtile
BAR_TMEM_PTR = 2  # epilogue warps + MMA warp: the TMEM address is ready


class GemmSm100(GemmBase):
    epi_warp_ids = (0, 1, 2, 3)  # warp w reads TMEM lanes 32*(w%4).. (tcgen05.ld sub-partition rule)
    mma_warp_id = 4
    load_warp_id = 5
    threads_per_cta = 32 * 6
    min_epi_stage = 2

    def __init__(self, config):
        super().__init__(config)
        # The kernel's parts (``self.k`` is this kernel): the TMEM epilogue and the block-scaled MMA
        # pieces (config.blockscaled: scale factors by TMA, SMEM -> TMEM, block-scaled UMMA).
        self.epi = Sm100Epilogue(self)
        self.mma_warp = Sm100MmaWarp(self)  # the MMA warp's role
        self.bs = BlockScaledMma(self)
        epi = config.epilogue
        # GEMM columns per stored output element: 2 per gated pair, 2 per packed FP4 byte.
        self.out_div = epi.cols_per_output * (quant_storage(epi.quant)[1] if epi.quant else 1)
        # The list form's machinery (a group table, per-group descriptors, the list scheduler) also
        # runs the K-grouped form here: its table is written from offs on the device.
        self.list_like = config.listed or config.kgrouped
        self.use_2cta = config.two_cta
        self.cta_per_mma = 2 if config.two_cta else 1
        self.cta_group = tcgen05.CtaGroup.TWO if config.two_cta else tcgen05.CtaGroup.ONE
        self.mma_tiler_mn = (config.tile_m, config.tile_n)
        self.cta_tile_mn = (config.tile_m // self.cta_per_mma, config.tile_n)
        # B is shared by the MMA tiles of one cluster column: cluster_m CTAs, i.e. cluster_m / 2 pairs.
        self.num_mcast_ctas_b = config.cluster_m // self.cta_per_mma
        self.is_b_mcast = self.num_mcast_ctas_b > 1
        self.num_epi_threads = 32 * len(self.epi_warp_ids)
        self.epi_barrier = pipeline.NamedBarrier(barrier_id=BAR_EPILOGUE, num_threads=self.num_epi_threads)
        self.tmem_ptr_barrier = pipeline.NamedBarrier(
            barrier_id=BAR_TMEM_PTR, num_threads=self.num_epi_threads + 32
        )
        self.blockscaled = config.blockscaled
        if self.blockscaled:
            self.sf_dtype = SF_DTYPES[config.sf_dtype]
            self.sf_vec = config.sf_vec
        # Shared-memory element types. A mixed kind::mxf8f6f4 pair (MXFP8 x MXFP4) holds its
        # 4-bit operand one element per byte: the TMA unpacks it (U4 -> U8, ``internal_type``)
        # so both operands share the byte-per-element layout the MMA reads.
        self.a_smem_dtype, self.b_smem_dtype = self.a_dtype, self.b_dtype
        if self.a_dtype.width != self.b_dtype.width:
            if self.a_dtype.width < 8:
                self.a_smem_dtype = cutlass.Int8
            if self.b_dtype.width < 8:
                self.b_smem_dtype = cutlass.Int8

    # ---------------------------------------------------------------------------------------
    def _setup(self, a_layout: LayoutEnum, b_layout: LayoutEnum, c_layout: LayoutEnum):
        cfg = self.config
        if cutlass.const_expr(self.blockscaled):
            self.bs._setup_blockscaled_mma(a_layout, b_layout)
        else:
            self.tiled_mma = sm100_utils.make_trivial_tiled_mma(
                self.a_dtype,
                self.b_dtype,
                a_layout.mma_major_mode(),
                b_layout.mma_major_mode(),
                self.acc_dtype,
                self.cta_group,
                self.mma_tiler_mn,
            )
        inst_k = cute.size(self.tiled_mma.shape_mnk, mode=[2])
        # K tile = 64 for 16-bit inputs, 128 for fp8, 256 for fp4
        self.mma_tiler = (*self.mma_tiler_mn, inst_k * 4)
        self.cta_tile_shape_mnk = (*self.cta_tile_mn, self.mma_tiler[2])
        # (V, M, N, K): V is the CTA inside an MMA pair (size 1 without two_cta).
        self.cluster_layout_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (self.tiled_mma.thr_id.shape,)
        )
        epi = cfg.epilogue
        # Gated, quantized and FP8 outputs store by coordinate: their subtile follows a bf16 output.
        self.direct_store = not (epi.gated or epi.quant or cfg.out_dtype in FP8_DTYPES)
        self.r2s_dtype = self.c_dtype if self.direct_store else cutlass.BFloat16
        self.epi_tile = sm100_utils.compute_epilogue_tile_shape(
            self.cta_tile_shape_mnk, self.use_2cta, c_layout, self.r2s_dtype
        )
        if epi.quant is not None or cfg.out_dtype in FP8_DTYPES:  # 32 columns per subtile: whole scale
            # blocks (quantized), the 8-bit subtile of an FP8 output (stored by coordinate)
            epi_m, _ = cute.product_each(cute.shape(self.epi_tile))
            self.epi_tile = (epi_m, 32 * epi.cols_per_output)
        # What one subtile writes: half the columns when gated (one output per gate/up pair), in
        # stored elements (FP4: bytes holding two).
        self.epi_tile_out = self.epi_tile
        if self.out_div > 1:
            epi_m, epi_n = cute.product_each(cute.shape(self.epi_tile))
            self.epi_tile_out = (epi_m, epi_n // self.out_div)

        # TMEM: one fp32 accumulator per stage; double-buffer when two fit.
        acc_shape = self.tiled_mma.partition_shape_C(self.mma_tiler[:2])
        acc_cols = memory.get_num_tmem_alloc_cols(self.tiled_mma.make_fragment_C(acc_shape), rounding=False)
        self.acc_overlap = False  # overlapping accumulator buffers (block-scaled, tile_n = 256)
        if cutlass.const_expr(self.blockscaled):
            self.bs._setup_blockscaled_tmem(acc_cols)
        else:
            self.acc_stage = 2 if 2 * acc_cols <= TMEM_COLUMNS else 1
            self.num_tmem_cols = memory.get_num_tmem_alloc_cols(
                self.tiled_mma.make_fragment_C(cute.append(acc_shape, self.acc_stage))
            )

        # SMEM: A/B stages first (they hide the load latency), leftovers go to the store ring.
        a_one = sm100_utils.make_smem_layout_a(self.tiled_mma, self.mma_tiler, self.a_smem_dtype, 1)
        b_one = sm100_utils.make_smem_layout_b(self.tiled_mma, self.mma_tiler, self.b_smem_dtype, 1)
        # Shared memory per stage counts the storage type (a 4-bit operand of a mixed pair takes a
        # byte per element); the TMA completes the bytes it reads, at the source width: the stage
        # barrier expects those (``tx_bytes``).
        ab_bytes = cute.size_in_bytes(self.a_smem_dtype, a_one) + cute.size_in_bytes(self.b_smem_dtype, b_one)
        tx_bytes = cute.size_in_bytes(self.a_dtype, a_one) + cute.size_in_bytes(self.b_dtype, b_one)
        if cutlass.const_expr(self.blockscaled):
            # One stage carries the k-tile's scale factors too (same barrier, same ring slot).
            sf_bytes = cute.size_in_bytes(
                self.sf_dtype, blockscaled_utils.make_smem_layout_sfa(self.tiled_mma, self.mma_tiler, self.sf_vec, 1)
            ) + cute.size_in_bytes(
                self.sf_dtype, blockscaled_utils.make_smem_layout_sfb(self.tiled_mma, self.mma_tiler, self.sf_vec, 1)
            )
            ab_bytes += sf_bytes
            tx_bytes += sf_bytes
            self.tx_sf_bytes = sf_bytes  # per CTA and stage (compile-check's transaction-byte rule)
        c_one = sm100_utils.make_smem_layout_epi(self.c_dtype, c_layout, self.epi_tile_out, 1)
        c_bytes = cute.size_in_bytes(self.c_dtype, c_one)
        budget = SMEM_CAPACITY_SM100 - MBAR_BYTES - tile_table_bytes(cfg.grouped or self.list_like) - self.min_epi_stage * c_bytes
        self.ab_stage = cfg.stages or budget // ab_bytes
        if self.ab_stage < 2 or self.ab_stage * ab_bytes > budget:
            raise ValueError(
                f"{cfg.name}: {self.ab_stage} stages of {ab_bytes} B do not fit in shared memory"
            )
        self.epi_stage = self.min_epi_stage + (budget - self.ab_stage * ab_bytes) // c_bytes

        self.a_smem_layout_staged = sm100_utils.make_smem_layout_a(
            self.tiled_mma, self.mma_tiler, self.a_smem_dtype, self.ab_stage
        )
        self.b_smem_layout_staged = sm100_utils.make_smem_layout_b(
            self.tiled_mma, self.mma_tiler, self.b_smem_dtype, self.ab_stage
        )
        self.epi_smem_layout_staged = sm100_utils.make_smem_layout_epi(
            self.c_dtype, c_layout, self.epi_tile_out, self.epi_stage
        )
        if cutlass.const_expr(self.blockscaled):
            self.sfa_smem_layout_staged = blockscaled_utils.make_smem_layout_sfa(
                self.tiled_mma, self.mma_tiler, self.sf_vec, self.ab_stage
            )
            self.sfb_smem_layout_staged = blockscaled_utils.make_smem_layout_sfb(
                self.tiled_mma, self.mma_tiler, self.sf_vec, self.ab_stage
            )
        # Bytes landing in the leader CTA's full barrier per stage: both CTAs of the pair.
        self.tma_bytes = tx_bytes * self.cta_per_mma

    def _shared_storage(self):
        """Barriers, TMEM address slot, grouped tile table, then the A/B (and scale-factor) stages
        and the store ring."""
        cfg = self.config
        MemRange, Align = cute.struct.MemRange, cute.struct.Align
        # (annotations are strings under ``from __future__ import annotations``: build them here)
        fields = {
            "ab_mbar": MemRange[cutlass.Int64, self.ab_stage * 2],
            "acc_mbar": MemRange[cutlass.Int64, self.acc_stage * 2],
            "tmem_dealloc_mbar": cutlass.Int64,
            "tmem_ptr": cutlass.Int32,
            "tile_start": MemRange[cutlass.Int32, tile_table_len(cfg.grouped or self.list_like)],
            "sA": Align[MemRange[self.a_smem_dtype, cute.cosize(self.a_smem_layout_staged)], 1024],
            "sB": Align[MemRange[self.b_smem_dtype, cute.cosize(self.b_smem_layout_staged)], 1024],
            "sC": Align[MemRange[self.c_dtype, cute.cosize(self.epi_smem_layout_staged)], 1024],
        }
        if cfg.scheduler != "static":
            fields.update(ring_storage_fields())
        if self.blockscaled:
            fields["sSFA"] = Align[MemRange[self.sf_dtype, cute.cosize(self.sfa_smem_layout_staged)], 128]
            fields["sSFB"] = Align[MemRange[self.sf_dtype, cute.cosize(self.sfb_smem_layout_staged)], 128]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # (M, K, L)
        mB: cute.Tensor,  # (N, K, L)
        mC: cute.Tensor,  # (M, N, L) output (gated: N / 2 columns)
        mCin: cute.Tensor | None,  # (M, N, L) residual C of beta * C, or None
        mBias: cute.Tensor | None,  # (N,) bias, or None
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        max_clusters: cutlass.Int32,
        stream: cuda.CUstream,
        mOffs: cute.Tensor | None = None,  # grouped: (E,) int32 cumulative end rows of A's experts
        mSFA: cute.Tensor | None = None,  # block-scaled: A's scales, 128x4 swizzled bytes (any shape)
        mSFB: cute.Tensor | None = None,  # block-scaled: B's scales, 128x4 swizzled bytes (any shape)
        # The sm_90a signature's epilogue arguments (one signature for both archs; not used here yet).
        mEpiSF: cute.Tensor | None = None,
        mEpiGS: cute.Tensor | None = None,
        mV0: cute.Tensor | None = None,
        mV1: cute.Tensor | None = None,
        mV2: cute.Tensor | None = None,
        mV3: cute.Tensor | None = None,
        mWorkspace: cute.Tensor | None = None,  # scheduler "dynamic": (1,) int32 tile counter, zeroed
        mAIdx: cute.Tensor | None = None,  # gather_a: (packed rows,) int32 row of A per packed row
        mZ: cute.Tensor | None = None,  # sm_90a's epilogue.preact (not built here)
    ):
        if cutlass.const_expr(self.config.flat):
            mA, mB, mC = self.unflatten(mA, mB, mC)
        self.c_layout = LayoutEnum.from_tensor(mC)
        self._setup(LayoutEnum.from_tensor(mA), LayoutEnum.from_tensor(mB), self.c_layout)
        cfg = self.config
        vmnk_shape = self.cluster_layout_vmnk.shape

        # A/B loads: the op picks 2-CTA (barrier of the leader) and/or multicast from the cluster shape.
        mIdx = None
        if cutlass.const_expr(cfg.gather_a):  # A's rows through the index (gemm.sm100.gather)
            tma_atom_a, tma_tensor_a, mIdx = gather_tma_atom(self, mA, mAIdx)
        else:
            tma_atom_a, tma_tensor_a = cute.nvgpu.make_tiled_tma_atom_A(
                sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_shape_mn, self.tiled_mma.thr_id),
                mA,
                cute.slice_(self.a_smem_layout_staged, (None, None, None, 0)),
                self.mma_tiler,
                self.tiled_mma,
                vmnk_shape,
                internal_type=self.a_smem_dtype if self.a_smem_dtype is not self.a_dtype else None,
            )
        tma_atom_b, tma_tensor_b = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_B(self.cluster_shape_mn, self.tiled_mma.thr_id),
            mB,
            cute.slice_(self.b_smem_layout_staged, (None, None, None, 0)),
            self.mma_tiler,
            self.tiled_mma,
            vmnk_shape,
            internal_type=self.b_smem_dtype if self.b_smem_dtype is not self.b_dtype else None,
        )
        tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(),
            mC,
            cute.select(self.epi_smem_layout_staged, mode=[0, 1]),
            self.epi_tile_out,
        )
        sf_args = (None,) * 8
        if cutlass.const_expr(self.blockscaled):
            sf_args = self.bs._make_sf_tma(mA, mB, mSFA, mSFB, vmnk_shape)

        self.shared_storage = self._shared_storage()
        self.check_smem_size(self.shared_storage.size_in_bytes(), SMEM_CAPACITY_SM100)
        if cutlass.const_expr(cfg.kgrouped):  # the group table (the workspace) from offs, on the device
            launch_kgrouped_table(mOffs, mWorkspace, mA, mB, mC, (cfg.tile_m, cfg.tile_n), stream)
            mOffs = mWorkspace
        if cutlass.const_expr(self.list_like):  # mOffs is the group table: each group's descriptors first
            self.launch_list_prep((tma_atom_a, tma_atom_b, tma_atom_c), mOffs, stream)
        self.kernel(
            tma_atom_a,
            tma_tensor_a,
            tma_atom_b,
            tma_tensor_b,
            tma_atom_c,
            tma_tensor_c,
            mCin,
            mBias,
            mC if cfg.grouped else None,
            mOffs,
            mIdx,
            mWorkspace,
            mEpiSF,
            mEpiGS,
            mV0,
            mV1,
            mV2,
            mV3,
            alpha,
            beta,
            self.tiled_mma,
            self.cluster_layout_vmnk,
            self.a_smem_layout_staged,
            self.b_smem_layout_staged,
            self.epi_smem_layout_staged,
            self.epi_tile,
            *sf_args,
        ).launch(
            grid=self.grid(self.acc_space(mC, mB), self.cta_tile_mn, max_clusters, mOffs, tma_tensor_a.shape[0]),
            block=[self.threads_per_cta, 1, 1],
            cluster=(*self.cluster_shape_mn, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    # ---------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        mC_mnl: cute.Tensor,
        mCin: cute.Tensor | None,
        mBias: cute.Tensor | None,
        mC_gmem: cute.Tensor | None,  # grouped: C itself, for predicated stores of partial tiles
        mOffs: cute.Tensor | None,
        mIdx: cute.Tensor | None,  # gather_a: (packed rows, K) the index, broadcast along K
        mWorkspace: cute.Tensor | None,
        mEpiSF: cute.Tensor | None,
        mEpiGS: cute.Tensor | None,
        mV0: cute.Tensor | None,
        mV1: cute.Tensor | None,
        mV2: cute.Tensor | None,
        mV3: cute.Tensor | None,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        tiled_mma: cute.TiledMma,
        cluster_layout_vmnk: cute.Layout,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        epi_smem_layout_staged: cute.ComposedLayout,
        epi_tile: cute.Tile,
        # Block-scaled only (None otherwise): scale-factor TMA atoms and tensors, the 1-CTA MMA
        # and cluster layout of the SFB loads, and the staged SFA/SFB smem layouts.
        tma_atom_sfa: cute.CopyAtom | None,
        mSFA_mkl: cute.Tensor | None,
        tma_atom_sfb: cute.CopyAtom | None,
        mSFB_nkl: cute.Tensor | None,
        tiled_mma_sfb: cute.TiledMma | None,
        cluster_layout_sfb_vmnk: cute.Layout | None,
        sfa_smem_layout_staged: cute.Layout | None,
        sfb_smem_layout_staged: cute.Layout | None,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == self.load_warp_id:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_c)
            if cutlass.const_expr(self.blockscaled):
                cpasync.prefetch_descriptor(tma_atom_sfa)
                cpasync.prefetch_descriptor(tma_atom_sfb)

        bidx, _, _ = cute.arch.block_idx()
        mma_coord_v = bidx % self.cta_per_mma  # which half of the MMA pair this CTA holds
        is_leader_cta = mma_coord_v == 0
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord_vmnk = cluster_layout_vmnk.get_flat_coord(cta_rank_in_cluster)

        smem = memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # One tcgen05.commit per stage arrives on every CTA that received the stage's multicast.
        ab_pipeline = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
            ),
            tx_count=self.tma_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        # Full: the leader's commit, multicast to both CTAs of the pair. Empty: one elected thread
        # per epilogue warp of both CTAs arrives on the leader's barrier.
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_mbar.data_ptr(),
            num_stages=self.acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, len(self.epi_warp_ids) * self.cta_per_mma
            ),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        # Initialises the 2-CTA dealloc mbarrier before the cluster-wide init sync below.
        tmem = memory.TmemAllocator(
            storage.tmem_ptr.ptr,
            barrier_for_retrieve=self.tmem_ptr_barrier,
            allocator_warp_id=self.epi_warp_ids[0],
            is_two_cta=self.use_2cta,
            two_cta_tmem_dealloc_mbar_ptr=storage.tmem_dealloc_mbar.ptr,
        )
        # Dynamic schedulers: the load, MMA and 4 epilogue warps read the tile ring.
        self.init_sched_ring(storage, 2 + len(self.epi_warp_ids), tidx)
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        # (MMA, MMA_M, MMA_K, STAGE), (MMA, MMA_N, MMA_K, STAGE), (EPI_M, EPI_N, EPI_STAGE)
        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        sC = storage.sC.get_tensor(epi_smem_layout_staged.outer, swizzle=epi_smem_layout_staged.inner)

        # Multicast masks: A goes to the CTAs of the cluster row (mode N), B to the cluster column
        # (mode M); in 2-CTA mode the masks also carry the pair's peer, whose barrier is the leader's.
        a_mcast_mask = None
        b_mcast_mask = None
        if cutlass.const_expr(self.is_a_mcast or self.is_b_mcast or self.use_2cta):
            a_mcast_mask = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, cluster_coord_vmnk, mcast_mode=2
            )
            b_mcast_mask = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, cluster_coord_vmnk, mcast_mode=1
            )

        # Global tiles are MMA tiles (tile_m rows: both CTAs of a pair); thr_mma picks our half.
        # (bM, bK, RestM, RestK, RestL); gather_a: (bM, bK, RestM, RestK) of the packed rows
        a_coord = (None, None) if cutlass.const_expr(self.config.gather_a) else (None, None, None)
        gA_mkl = cute.local_tile(mA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), a_coord)
        # (bN, bK, RestN, RestK, RestL)
        gB_nkl = cute.local_tile(mB_nkl, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        k_tile_cnt = cute.size(gA_mkl, mode=[3])
        thr_mma = tiled_mma.get_slice(mma_coord_v)
        # (MMA, MMA_M, MMA_K, RestM, RestK, RestL)
        tCgA = thr_mma.partition_A(gA_mkl)
        # (MMA, MMA_N, MMA_K, RestN, RestK, RestL)
        tCgB = thr_mma.partition_B(gB_nkl)
        epi = self.config.epilogue
        if cutlass.const_expr(self.out_div == 1):
            # (bM, bN, RestM, RestN, RestL)
            gC_mnl = cute.local_tile(mC_mnl, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
            # (MMA, MMA_M, MMA_N, RestM, RestN, RestL) -> (CTA_M, CTA_N, RestM, RestN, RestL)
            gC_cta = thr_mma.partition_C(gC_mnl)[((None, None), 0, 0, None, None, None)]
        else:
            # (CTA_M, CTA_N / 2, RestM * CTA_PER_MMA, RestN, RestL): output tiles of one CTA; CTA v
            # of an MMA pair holds rows [v, v + 1) * CTA_M of the pair's tile (as partition_C).
            gC_cta = cute.local_tile(
                mC_mnl, (self.cta_tile_mn[0], self.cta_tile_mn[1] // self.out_div), (None, None, None)
            )
        # (MMA, MMA_M, MMA_N, RestM, RestN, RestL): global (m, n, l) GEMM coordinate per accumulator
        tCcAcc = None
        if cutlass.const_expr(epi.needs_coords and not self.config.grouped):
            tCcAcc = thr_mma.partition_C(
                cute.local_tile(
                    cute.make_identity_tensor(self.acc_space(mC_mnl, mB_nkl).shape),
                    cute.slice_(self.mma_tiler, (None, None, 0)),
                    (None, None, None),
                )
            )

        # (TMA, STAGE), (TMA, RestM, RestK, RestL)
        if cutlass.const_expr(self.config.gather_a):  # the k-tiles come per tile (a_tiles below)
            tAsA, tAgA = gathered_smem(self, tma_atom_a, thr_mma, sA, mA_mkl, mIdx), None
        else:
            tAsA, tAgA = cpasync.tma_partition(
                tma_atom_a,
                cluster_coord_vmnk[2],
                cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape),
                cute.group_modes(sA, 0, 3),
                cute.group_modes(tCgA, 0, 3),
            )
        # (TMA, STAGE), (TMA, RestN, RestK, RestL)
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b,
            cluster_coord_vmnk[1],
            cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape),
            cute.group_modes(sB, 0, 3),
            cute.group_modes(tCgB, 0, 3),
        )
        # (MMA, MMA_M, MMA_N, ACC_STAGE): layout of the TMEM accumulators (address comes later)
        acc_layout = tiled_mma.make_fragment_C(
            cute.append(tiled_mma.partition_shape_C(self.mma_tiler[:2]), 2 if self.acc_overlap else self.acc_stage)
        ).layout
        if cutlass.const_expr(self.acc_overlap):
            acc_layout = self.bs.overlapped_acc_layout(acc_layout)
        cfg = self.config
        if cutlass.const_expr(cfg.grouped):
            # The tile map lives in shared memory, built by warp 0 from offs (no host sync).
            tile_start, n_cluster_tiles = tile_table(
                storage.tile_start, self.acc_space(mC_mnl, mB_nkl).shape[1], cfg.tile_n, cfg.cluster_n
            )
            if warp_idx == 0:
                fill_tile_starts(tile_start, mOffs, mA_mkl.shape[0], cfg.tile_m, n_cluster_tiles, cute.arch.lane_idx())
        elif cutlass.const_expr(self.list_like):
            # List form: mOffs is the group table (``gemm.grouped_parts.list_tile_table``).
            tile_start, num_groups = list_tile_table(storage.tile_start, mOffs, warp_idx)
        else:
            sched = self.make_scheduler(
                self.acc_space(mC_mnl, mB_nkl), self.cta_tile_mn, ctas_per_tile_m=self.cta_per_mma
            )

        sf = None
        if cutlass.const_expr(self.blockscaled):
            sf = self.bs.partition_sf(
                storage, tma_atom_sfa, mSFA_mkl, tma_atom_sfb, mSFB_nkl, tiled_mma_sfb,
                cluster_layout_vmnk, cluster_layout_sfb_vmnk, cluster_coord_vmnk, cta_rank_in_cluster,
                sfa_smem_layout_staged, sfb_smem_layout_staged, thr_mma, mma_coord_v,
            )  # fmt: skip

        # Peers' barriers must be initialised before any TMA multicast / remote arrive reaches them.
        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        a_tiles = tAgA
        c_tiles = None
        if cutlass.const_expr(cfg.grouped):
            # (gather_a: the TMA tensor's rows are the index's, the packed rows)
            sched = make_grouped_scheduler(tile_start, mOffs, mA_mkl.shape[0], n_cluster_tiles, cfg)
            a_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape)

            def a_tiles(tile):
                """(TMA, RestK) A k-tiles of a grouped tile: rows from the expert's first row."""
                m_tile, _, _, row_start, _ = tile
                # (bM, bK, RestM, RestK, RestL) -> (MMA, MMA_M, MMA_K, RestM, RestK, RestL)
                gA = cute.local_tile(
                    from_row(mA_mkl, row_start), cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None)
                )
                _, tAgA_e = cpasync.tma_partition(
                    tma_atom_a, cluster_coord_vmnk[2], a_cta_layout,
                    cute.group_modes(sA, 0, 3), cute.group_modes(thr_mma.partition_A(gA), 0, 3),
                )  # fmt: skip
                return tAgA_e[(None, m_tile, None, 0)]

            if cutlass.const_expr(cfg.gather_a):
                a_tiles = gathered_a_tiles(self, tma_atom_a, thr_mma, sA, mA_mkl, mIdx)

            c_tiles = self.epi.grouped_c_tiles(mC_mnl, mC_gmem, mB_nkl, thr_mma, sC, epi_tile, tma_atom_c)

        k_tiles, load_descs, out_desc = k_tile_cnt, None, None
        if cutlass.const_expr(self.list_like):
            # The host (K-grouped: the table kernel) gives K = 0 groups no tiles (an MMA-less tile would store an unwritten
            # accumulator).
            sched = make_list_scheduler(tile_start, mOffs, num_groups, cfg.tile_m)
            k_tiles, load_descs, out_desc = list_roles(mOffs, num_groups, self.mma_tiler[2])

        load_sched = sched
        if cutlass.const_expr(cfg.scheduler != "static"):
            # The load warp of cluster rank 0 fetches tiles (atomic counter or CLC query); every
            # role of every CTA reads them from its ring.
            sched = self.broadcast_scheduler(sched, storage, mWorkspace)
            load_sched = sched.as_fetcher(cta_rank_in_cluster == 0)

        if warp_idx == self.load_warp_id:
            extra = ()
            if cutlass.const_expr(self.blockscaled):
                sfa_block = None
                if cutlass.const_expr(cfg.grouped):

                    def sfa_block(tile):
                        """Expert tile[2]'s first scale block (its m-tiles before it: the table's
                        start over the n cluster tiles) + the tile's m-tile."""
                        return tile_start[tile[2]] // n_cluster_tiles + tile[0]

                extra = self.bs.sf_load_operands(tma_atom_sfa, tma_atom_sfb, sf, sfa_block)
            self.load_ab(
                load_sched, ab_pipeline, k_tiles,
                tma_atom_a, a_tiles, tAsA, a_mcast_mask,
                tma_atom_b, tBgB, tBsB, b_mcast_mask, extra, load_descs,
            )  # fmt: skip
        elif warp_idx == self.mma_warp_id:
            if cutlass.const_expr(self.blockscaled):
                self.bs.mma_blockscaled(
                    sched, ab_pipeline, acc_pipeline, tmem,
                    tiled_mma, acc_layout, sA, sB, k_tile_cnt, is_leader_cta, sf,
                )  # fmt: skip
            else:
                self.mma_warp.mma(
                    sched, ab_pipeline, acc_pipeline, tmem,
                    tiled_mma, acc_layout, sA, sB, k_tiles, is_leader_cta,
                )  # fmt: skip
        elif warp_idx < self.mma_warp_id:
            self.epi.epilogue(
                sched, acc_pipeline, tmem, acc_layout,
                gC_cta, sC, epi_tile, tma_atom_c, alpha, tidx, warp_idx,
                tCcAcc, mCin, mBias, beta, mma_coord_v, c_tiles,
                (mEpiSF, mEpiGS, mC_mnl.shape[0], mC_mnl.shape[1] * (self.out_div // epi.cols_per_output)),
                (mV0, mV1, mV2, mV3), mB_nkl.shape[0] if cutlass.const_expr(cfg.grouped) else None,
                out_desc,
            )  # fmt: skip


    # -- block-scaled pieces --------------------------------------------------------------------
    def acc_space(self, mC: cute.Tensor, mB: cute.Tensor):
        """What the tiles cover: the (M, N, L) output, or for gated outputs an (M, 2 * N', L)
        identity tensor over the GEMM's columns (mB is (N, K, L))."""
        if self.out_div == 1:
            return mC
        return cute.make_identity_tensor((mC.shape[0], mB.shape[0], mC.shape[2]))
