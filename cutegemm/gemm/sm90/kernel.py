"""Dense GEMM for Hopper (sm_90a): persistent, warp-specialized, WGMMA.

Pipeline (one CTA; a cluster of cluster_m x cluster_n CTAs shares A/B tiles by TMA multicast):

    warp 0 (producer, 40 regs)      consumer warpgroups 1..W (WGMMA, 232 regs)
    ---------------------------     ------------------------------------------------------
    for tile in scheduler:          for tile in scheduler:
      for k in K-tiles:               for k in K-tiles:
        wait stage empty                wait stage full -> WGMMA (acc in registers)
        TMA A,B -> smem stage           release stage k-1 once WGMMA k-1 retired
                                      epilogue per (epi_m x epi_n) subtile:
                                        acc -> epilogue_subtile -> cast -> stmatrix -> smem
                                        -> TMA store (ring of epi_stage buffers)

Two consumer schedules (config.pingpong):
- cooperative: W = tile_m // 64 warpgroups split every tile along M (64 rows each). While they
  run the epilogue of tile i, the producer already loads tile i+1 into free stages.
- pingpong: 2 warpgroups take alternate tiles (WG0: tiles 0, 2, 4, ... of this CTA; WG1: 1, 3,
  ...). Named barriers hand the tensor cores from one to the other after each mainloop, so
  one warpgroup's epilogue runs under the other's WGMMAs. Each has its own epilogue buffers.
Epilogue ops (``config.epilogue``, see ``cutegemm.epilogue.ops``): bias, beta * C and gated
activations need each accumulator element's global (m, n, l) coordinate; an identity tensor
goes through the accumulator's own partition (thr_mma.partition_C -> tiled_copy_r2s.retile), so
the coordinates match the registers by construction. C and bias are read from global memory per
element. Gated (swiglu/geglu): the accumulator tile is tile_m x tile_n GEMM columns, the output
tile tile_m x tile_n/2; each gated value is written to shared memory by coordinate (st.shared,
no stmatrix) and TMA-stored like any subtile; with preact the values before the gate go out too
(stmatrix into their own ring, a second TMA store in the same bulk group: ``Sm90Epilogue``).

Scheduler (config.scheduler): "static" walks a fixed tile sequence in every role; "dynamic"
(cooperative only) lets the producer warp of cluster rank 0 fetch tiles from a global atomic
counter and broadcast them to every warp of the cluster through a shared-memory ring
(``schedulers.dynamic``).

FP8 (e4m3): every 128-wide K tile's WGMMA partial sum is promoted into an fp32 accumulator
(unless fast_accum); with config.fp8_blockwise (DeepSeek 1x128 / 128x128 scales, in mSFA /
mSFB) it is multiplied by scale_a[row, kt] * scale_b[n_block, kt] as it is added, scale_a riding
the stage ring beside A (TMA), scale_b loaded from global memory a K tile ahead (that mainloop:
``gemm.sm90.blockwise``, mixed in).

Constraints: see ``config.config_errors`` (tile_m 64/128, 192 for 16-bit dense, tile_n 64..256, cluster <= 4).
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.tensor_utils import LayoutEnum

from ...config import FP8_DTYPES, SWAP_CHUNK
from ...epilogue.quant import quant_storage
from ...schedulers.dynamic import RING_DEPTH, ring_storage_fields
from ...schedulers.grouped import group_range
from ..base import GemmBase
from ..grouped_parts import (
    fill_tile_starts,
    grouped_acc_space,
    grouped_k_tiles,
    list_roles,
    list_tile_table,
    make_grouped_scheduler,
    make_list_scheduler,
    offset_k_tiles,
    tile_table,
    tile_table_bytes,
    tile_table_len,
)
from .accumulators import AccumulatorScaling
from .blockwise import BlockwiseMainloop
from .consumer import Sm90Consumers
from .epilogue import Sm90Epilogue
from .gather import GatherA
from .mx import MX_PARTS, MxMainloop
from .split import SplitK
from .swap import SwapAb
from .zero import StageZero

SMEM_CAPACITY_SM90 = 232448
# Named barriers: 1, 2 are the epilogue's (sm90.epilogue.BAR_EPILOGUE + warpgroup turn)


class GemmSm90(GemmBase):
    threads_per_warpgroup = 128
    load_registers = 40
    mma_registers = 232

    def __init__(self, config):
        super().__init__(config)
        # The kernel's parts: objects that read this kernel's config and layouts (``self.k``);
        # the config decides which of them a variant uses.
        self.consumers = Sm90Consumers(self)  # the consumer warpgroups: mainloop, then epilogue
        self.epi = Sm90Epilogue(self)  # accumulator -> epilogue ops -> shared memory -> TMA store
        self.accum = AccumulatorScaling(self)  # FP8 scales / promotion before the epilogue
        self.blockwise = BlockwiseMainloop(self)  # config.fp8_blockwise: DeepSeek 1x128 / 128x128 scales
        self.mx = MxMainloop(self)  # config.fp8_mx: MXFP8 emulated by FP8 WGMMA per 32-wide K block
        self.split = SplitK(self)  # config.split_k: K ranges summed through a workspace or the cluster
        self.swap = SwapAb(self)  # config.swap_ab: C^T = B^T A^T for few tokens
        self.zero = StageZero(self)  # zeroed stage rows / K columns outside a partial box
        self.gather = GatherA(self)  # config.gather_a / gather_b: an operand through an index, by cp.async
        if config.gathers:  # the producer warpgroup computes addresses: registers from the consumers
            self.load_registers, self.mma_registers = 56, 224
        self.out_per_elem = quant_storage(config.epilogue.quant)[1] if config.epilogue.quant else 1
        # registers -> stmatrix -> smem, else by coordinate (gated, quantized, FP8: epilogue.ops.store_saturated)
        self.direct_store = not (config.epilogue.gated or config.epilogue.quant or config.out_dtype in FP8_DTYPES)
        self.pingpong = config.pingpong
        self.num_mma_wg = 2 if self.pingpong else config.tile_m // 64
        if self.num_mma_wg == 3:  # 192-row tiles: three consumer warpgroups share the register file
            self.load_registers, self.mma_registers = 40, 152
        # Warpgroups that share one tile's WGMMAs (and its epilogue barrier).
        self.wg_per_tile = 1 if self.pingpong else self.num_mma_wg
        self.atom_layout_mnk = (self.wg_per_tile, 1, 1)
        self.threads_per_cta = (1 + self.num_mma_wg) * self.threads_per_warpgroup
        self.threads_per_tile = self.wg_per_tile * self.threads_per_warpgroup
        self.load_warp_id = 0
        # Epilogue buffer groups: one per warpgroup in pingpong, one shared in cooperative.
        self.epi_groups = 2 if self.pingpong else 1

    # ---------------------------------------------------------------------------------------
    def _setup(self, a_layout: LayoutEnum, b_layout: LayoutEnum, c_layout: LayoutEnum):
        cfg = self.config
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            a_layout.sm90_mma_major_mode(),
            b_layout.sm90_mma_major_mode(),
            self.acc_dtype,
            self.atom_layout_mnk,
            tiler_mn=(64, cfg.tile_n // MX_PARTS if cfg.fp8_mx or cfg.promote_k else cfg.tile_n),  # WGMMA per part
        )
        inst_k = cute.size(self.tiled_mma.shape_mnk, mode=[2])
        self.tile_shape_mnk = (cfg.tile_m, cfg.tile_n, inst_k * 4)  # K tile = 64 for 16-bit inputs
        self.cta_layout_mnk = cute.make_layout((*self.cluster_shape_mn, 1))
        # Epilogue subtile x 32 columns: all cooperative WGs' rows, or one WG's 64 rows (pingpong).
        # A quantized output takes 32 output columns per subtile (whole scale blocks).
        epi = cfg.epilogue
        cpo = epi.cols_per_output
        self.epi_tile = (64 * self.wg_per_tile, 32 * cpo if epi.quant else 32 if cfg.tile_n % 32 == 0 else 16)
        # Accumulator (rows, columns) per stored element: gated halves the GEMM's columns (one
        # output per gate/up pair), FP4 stores bytes holding two. swap_ab: the stored rows are the
        # GEMM's columns, so gated halves the rows (swap takes no quantized output).
        self.out_div = (cpo, 1) if cfg.swap_ab else (1, cpo * self.out_per_elem)
        # What one subtile writes, in stored elements
        self.epi_tile_out = (self.epi_tile[0] // self.out_div[0], self.epi_tile[1] // self.out_div[1])
        ab_bytes = (cfg.tile_m + cfg.tile_n) * self.tile_shape_mnk[2] * self.a_dtype.width // 8
        if cfg.fp8_mx:  # the K tile's scales ride with A and B
            ab_bytes += self.mx.mx_stage_bytes()
        if cfg.fp8_blockwise:  # the K tile's scale_a rows (sfb_cols: and scale_b columns) ride with A and B
            ab_bytes += (self.blockwise.sfa_stage_floats() + (self.blockwise.sfb_stage_floats() if cfg.sfb_cols else 0)) * 4
        epi_stage_bytes = cute.size(self.epi_tile_out) * self.c_dtype.width // 8 * self.epi_groups
        if epi.preact:  # + the ring of the values before the gate (Sm90Epilogue.preact_smem_layout)
            epi_stage_bytes += cute.size(self.epi_tile) * self.c_dtype.width // 8 * self.epi_groups
        # 1 KiB below sA for the mbarriers and the scheduler ring; 32 B past sC for the scale words
        # (sSFA / sSFB, 16-byte aligned; one unused word each when there are no scale stages):
        # the storage's size rounds up to its 1 KiB alignment, so A + B + C filling the rest
        # exactly would overflow by 1 KiB (a 64x64 tile with FP4 output did, at launch).
        budget = SMEM_CAPACITY_SM90 - 1024 - 32 - tile_table_bytes(cfg.grouped or cfg.listed) - 16 * (cfg.split_k > 1)
        if cfg.split_cluster:  # range 0's receive slots (gemm.sm90.split)
            budget -= self.split.split_recv_floats() * 4 + 16

        def ab_stages(epi_stage):
            return (budget - epi_stage * epi_stage_bytes) // ab_bytes

        # Epilogue ring: 4 buffers (cooperative) / 2 per warpgroup (pingpong), fewer (not below 2)
        # where that frees room for one more A/B stage (e.g. grouped 128x256: its tile table
        # would leave 3 stages beside 4 buffers, 4 beside 3).
        self.epi_stage = cfg.epi_stages or (2 if self.pingpong else 4)
        if not cfg.epi_stages:
            while self.epi_stage > 2 and ab_stages(self.epi_stage) < ab_stages(2):
                self.epi_stage -= 1
        budget -= self.epi_stage * epi_stage_bytes
        self.ab_stage = cfg.stages or budget // ab_bytes
        if self.ab_stage < 2 or self.ab_stage * ab_bytes > budget:
            raise ValueError(f"{cfg.name}: {self.ab_stage} stages of {ab_bytes} B do not fit in shared memory")

        def staged_layout(layout, dtype, mn, stages, is_k_major):
            major_size = self.tile_shape_mnk[2] if is_k_major else mn
            atom = warpgroup.make_smem_layout_atom(
                sm90_utils.get_smem_layout_atom(layout, dtype, major_size), dtype
            )
            return cute.tile_to_shape(
                atom,
                (mn, self.tile_shape_mnk[2], stages),
                order=(0, 1, 2) if is_k_major else (1, 0, 2),
            )

        # swap_ab: A is the weights (K-major when B was), B the tokens (K-major).
        a_k_major = cfg.b_major == "k" if cfg.swap_ab else cfg.a_major == "k"
        b_k_major = cfg.swap_ab or cfg.b_major == "k"
        self.swap_majors = (a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode())
        self.a_smem_layout_staged = staged_layout(a_layout, self.a_dtype, cfg.tile_m, self.ab_stage, a_k_major)
        # config.a_rows: A's TMA box, the first a_rows rows of every stage (a K-major stage is
        # whole 8-row swizzle atoms, row-block major: the box is its first a_rows / 8 atoms)
        self.a_box_rows = cfg.a_rows or cfg.tile_m

        def a_box_staged():  # built where it is used (host: the TMA atom; kernel: the partition)
            if not cfg.a_rows:
                return self.a_smem_layout_staged
            staged = staged_layout(a_layout, self.a_dtype, cfg.tile_m, self.ab_stage, a_k_major)
            rows = (cute.make_layout(self.a_box_rows), cute.make_layout(self.tile_shape_mnk[2]), cute.make_layout(self.ab_stage))
            return cute.composition(staged, rows)

        self.a_box_staged = a_box_staged
        self.b_smem_layout_staged = staged_layout(b_layout, self.b_dtype, cfg.tile_n, self.ab_stage, b_k_major)
        if cfg.swap_ab:  # the token operand's TMA box: 32 rows
            self.b_chunk_layout = staged_layout(b_layout, self.b_dtype, SWAP_CHUNK, 1, True)
        c_major_size = self.epi_tile_out[1] if c_layout.is_n_major_c() else self.epi_tile_out[0]
        c_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(c_layout, self.c_dtype, c_major_size), self.c_dtype
        )
        self.epi_smem_layout_staged = cute.tile_to_shape(
            c_atom,
            (*self.epi_tile_out, self.epi_stage * self.epi_groups),
            order=(1, 0, 2) if c_layout.is_m_major_c() else (0, 1, 2),
        )
        self.epi_smem_layout_z = self.epi.preact_smem_layout(c_layout) if epi.preact else None

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
        mSFA: cute.Tensor | None = None,  # FP8 block scales (fp8_blockwise / fp8_mx), else None
        mSFB: cute.Tensor | None = None,
        mEpiSF: cute.Tensor | None = None,  # quantized output: its scale bytes (128x4 swizzled)
        mEpiGS: cute.Tensor | None = None,  # quantized NVFP4 output: (1,) fp32 global scale
        mV0: cute.Tensor | None = None,  # user epilogue vectors
        mV1: cute.Tensor | None = None,
        mV2: cute.Tensor | None = None,
        mV3: cute.Tensor | None = None,
        mWorkspace: cute.Tensor | None = None,  # scheduler "dynamic": (1,) int32 tile counter, zeroed
        mAIdx: cute.Tensor | None = None,  # gather_a: (packed rows,) int32 row of A per packed row
        mZ: cute.Tensor | None = None,  # epilogue.preact: (M, N, L) the values before the gate
    ):
        if cutlass.const_expr(self.config.flat):
            mA, mB, mC = self.unflatten(mA, mB, mC)
        self.c_layout = LayoutEnum.from_tensor(mC)
        self._setup(LayoutEnum.from_tensor(mA), LayoutEnum.from_tensor(mB), self.c_layout)
        cfg = self.config

        def tma_load(tensor, staged, tile, mcast):
            op = cpasync.CopyBulkTensorTileG2SOp() if mcast == 1 else cpasync.CopyBulkTensorTileG2SMulticastOp()
            return cpasync.make_tiled_tma_atom(
                op, tensor, cute.slice_(staged, (None, None, 0)), tile, num_multicast=mcast
            )

        tma_atom_a, tma_tensor_a = tma_load(
            mA, self.a_box_staged(), (self.a_box_rows, self.tile_shape_mnk[2]), self.num_mcast_ctas_a
        )
        if cutlass.const_expr(cfg.swap_ab):
            # Tokens in 32-row boxes, each issued whole by one CTA and multicast to the cluster.
            tma_atom_b, tma_tensor_b = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp() if not self.is_b_mcast else cpasync.CopyBulkTensorTileG2SMulticastOp(),
                mB, cute.slice_(self.b_chunk_layout, (None, None, 0)), (SWAP_CHUNK, self.tile_shape_mnk[2]),
                num_multicast=1,
            )  # fmt: skip
        else:
            tma_atom_b, tma_tensor_b = tma_load(
                mB, self.b_smem_layout_staged, (cfg.tile_n, self.tile_shape_mnk[2]), self.num_mcast_ctas_b
            )
        tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(),
            mC,
            cute.slice_(self.epi_smem_layout_staged, (None, None, 0)),
            self.epi_tile_out,
        )

        tma_atom_z = tma_tensor_z = None
        if cutlass.const_expr(cfg.epilogue.preact):
            tma_atom_z, tma_tensor_z = self.epi.preact_tma(mZ)
        tma_atom_sfa = tma_atom_sfb = None
        if cutlass.const_expr(cfg.fp8_mx):
            tma_atom_sfa, mSFA, tma_atom_sfb, mSFB = self.mx.mx_tma(mSFA, mSFB)
        if cutlass.const_expr(cfg.fp8_blockwise):
            tma_atom_sfa, mSFA = self.blockwise.sfa_tma(mSFA)
            if cutlass.const_expr(cfg.sfb_cols):
                tma_atom_sfb, mSFB = self.blockwise.sfb_tma(mSFB)
        table_len = tile_table_len(cfg.grouped or cfg.listed)
        # Scale stages are TMA destinations: 128-byte aligned (MXFP8 emulation: both; block scales:
        # scale_a); otherwise one unused word each.
        sf_len = self.mx.mx_cosizes() if cfg.fp8_mx else (1, 1)
        sf_align = (128, 128) if cfg.fp8_mx else (16, 16)
        if cutlass.const_expr(cfg.fp8_blockwise):
            sf_len, sf_align = (cute.cosize(self.blockwise.sfa_layout()), 1), (128, 16)
            if cutlass.const_expr(cfg.sfb_cols):
                sf_len, sf_align = (sf_len[0], cute.cosize(self.blockwise.sfb_layout())), (128, 128)
        # The dynamic schedulers' tile ring (static: a 1-slot stub; every field here sits below
        # the 1 KiB-aligned sA, so it moves nothing).
        ring = ring_storage_fields(RING_DEPTH if cfg.scheduler != "static" else 1)
        ring_full, ring_empty, ring_resp = ring["sched_full"], ring["sched_empty"], ring["sched_resp"]

        split_k = cfg.split_k > 1

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.ab_stage * 2]
            tile_start: cute.struct.MemRange[cutlass.Int32, table_len]
            sched_full: ring_full
            sched_empty: ring_empty
            sched_resp: ring_resp
            sA: cute.struct.Align[cute.struct.MemRange[self.a_dtype, cute.cosize(self.a_smem_layout_staged)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(self.b_smem_layout_staged)], 1024]
            sC: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, cute.cosize(self.epi_smem_layout_staged)], 1024
            ]
            # MXFP8 emulation / block-scaled FP8's scale_a: fp32 scale stages (one unused word each otherwise)
            sSFA: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, sf_len[0]], sf_align[0]]
            sSFB: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, sf_len[1]], sf_align[1]]
            if cutlass.const_expr(cfg.epilogue.preact):
                sZ: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(self.epi_smem_layout_z)], 1024]
            if cutlass.const_expr(split_k):  # split K: "this unit completes the tile" (gemm.sm90.split)
                split_flag: cute.struct.MemRange[cutlass.Int32, 4]
            if cutlass.const_expr(cfg.split_cluster):  # range 0's receive slots and their mbarrier
                split_mbar: cute.struct.MemRange[cutlass.Int64, 2]
                split_recv: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.split.split_recv_floats()], 16]

        self.shared_storage = SharedStorage
        self.check_smem_size(SharedStorage.size_in_bytes(), SMEM_CAPACITY_SM90)
        if cutlass.const_expr(cfg.listed):  # mOffs is the group table: each group's descriptors first
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
            mEpiSF,
            mEpiGS,
            mV0,
            mV1,
            mV2,
            mV3,
            mWorkspace,
            (mB if cfg.gather_b else mA) if cfg.gathers else None,
            mAIdx,
            mSFA if cfg.fp8_blockwise or cfg.fp8_mx else None,
            mSFB if cfg.fp8_blockwise or cfg.fp8_mx else None,
            tma_atom_sfa,
            tma_atom_sfb,
            tma_atom_z,
            tma_tensor_z,
            mZ if cfg.grouped and cfg.epilogue.preact else None,
            alpha,
            beta,
            self.tiled_mma,
            self.cta_layout_mnk,
            self.a_smem_layout_staged,
            self.b_smem_layout_staged,
            self.epi_smem_layout_staged,
        ).launch(
            grid=self.grid(
                self.acc_space(mC, mB), (cfg.tile_m, cfg.tile_n), max_clusters, mOffs, mA.shape[0]
            ),
            block=[self.threads_per_cta, 1, 1],
            # split_cluster: the split_k units of a tile form one cluster along z
            cluster=(1, 1, cfg.split_k) if cfg.split_cluster else (*self.cluster_shape_mn, 1),
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
        mEpiSF: cute.Tensor | None,
        mEpiGS: cute.Tensor | None,
        mV0: cute.Tensor | None,
        mV1: cute.Tensor | None,
        mV2: cute.Tensor | None,
        mV3: cute.Tensor | None,
        mWorkspace: cute.Tensor | None,
        mA_rows: cute.Tensor | None,  # gather_a / gather_b: A (B) itself, read by cp.async
        mAIdx: cute.Tensor | None,  # gather_a: (packed rows,) int32 row of A per packed row
        mSFA: cute.Tensor | None,  # FP8 block scaling: TMA coordinates of the (M, ceil(K/128), 1) scales of A
        mSFB: cute.Tensor | None,  # FP8 block scaling: (ceil(N/128), ceil(K/128)[, E]) fp32 scales of B
        tma_atom_sfa: cute.CopyAtom | None,  # fp8_mx / fp8_blockwise: TMA of the scales (mSFA / mSFB: TMA tensors)
        tma_atom_sfb: cute.CopyAtom | None,
        tma_atom_z: cute.CopyAtom | None,  # epilogue.preact: TMA store of the values before the gate
        mZ_mnl: cute.Tensor | None,  # ... its TMA coordinate tensor
        mZ_gmem: cute.Tensor | None,  # ... grouped: the tensor itself (partial-tile stores)
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        tiled_mma: cute.TiledMma,
        cta_layout_mnk: cute.Layout,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        epi_smem_layout_staged: cute.ComposedLayout,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == self.load_warp_id:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_c)
            if cutlass.const_expr(self.config.epilogue.preact):
                cpasync.prefetch_descriptor(tma_atom_z)

        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord_mnk = cta_layout_mnk.get_flat_coord(cta_rank_in_cluster)
        a_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord_mnk, mode=1)
        b_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord_mnk, mode=0)
        a_mcast_mask = a_mcast_mask if self.is_a_mcast else 0
        b_mcast_mask = b_mcast_mask if self.is_b_mcast else 0

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        tma_bytes = cute.size_in_bytes(
            self.a_dtype, cute.slice_(a_smem_layout_staged, (None, None, 0))
        ) + cute.size_in_bytes(self.b_dtype, cute.slice_(b_smem_layout_staged, (None, None, 0)))
        if cutlass.const_expr(self.config.fp8_mx):
            tma_bytes += self.mx.mx_stage_bytes()
        if cutlass.const_expr(self.config.fp8_blockwise):
            tma_bytes += self.blockwise.stage_bytes()
        if cutlass.const_expr(self.config.a_rows):  # A's box holds a_rows of the tile_m rows
            tma_bytes -= (self.config.tile_m - self.a_box_rows) * self.tile_shape_mnk[2] * self.a_dtype.width // 8
        if cutlass.const_expr(self.config.gathers):  # A (B) arrives by cp.async (its own arrivals)
            tma_bytes -= self.gather.gathered_stage_bytes()
        self.tma_bytes = tma_bytes  # the stage barrier's bytes (compile-check's transaction-byte rule)
        # Every consumer warp of every CTA that reads a multicast stage releases it.
        mcast_size = self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.gather.producer_arrivals() if cutlass.const_expr(self.config.gathers) else 1
            ),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, mcast_size * self.wg_per_tile * 4),
            tx_count=tma_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )
        if cutlass.const_expr(self.config.split_cluster):
            # The cluster is the tile's K ranges, not a multicast group: every CTA's consumer warps
            # release their own stages (the pipeline's size-1 layout would pick rank 0's lanes).
            ab_pipeline = dataclasses.replace(ab_pipeline, is_signaling_thread=tidx % 32 == 0)
            self.split.split_cluster_arm(storage.split_mbar.data_ptr(), tidx, False)
        # Dynamic schedulers: every consumer warp and the producer warp read the tile ring.
        self.init_sched_ring(storage, 1 + 4 * self.num_mma_wg, tidx)
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)
        if cutlass.const_expr(self.config.split_cluster):  # range 0's mbarrier before any st.async
            cute.arch.cluster_arrive_relaxed()

        # (bM, bK, STAGE), (bN, bK, STAGE), (EPI_M, EPI_N, EPI_STAGE)
        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        sC = storage.sC.get_tensor(epi_smem_layout_staged.outer, swizzle=epi_smem_layout_staged.inner)
        preact = None  # epilogue.preact: what the epilogue stores the values before the gate with
        if cutlass.const_expr(self.config.epilogue.preact):
            z_layout = self.epi.preact_smem_layout(self.c_layout)  # (built here: a layout from the host is not in the kernel's region)
            preact = (tma_atom_z, storage.sZ.get_tensor(z_layout.outer, swizzle=z_layout.inner), mZ_mnl, mZ_gmem)

        # (bM, bK, RestM, RestK, RestL)
        gA_mkl = cute.local_tile(mA_mkl, cute.slice_(self.tile_shape_mnk, (None, 0, None)), (None, None, None))
        # (bN, bK, RestN, RestK, RestL)
        gB_nkl = cute.local_tile(mB_nkl, cute.slice_(self.tile_shape_mnk, (0, None, None)), (None, None, None))
        epi = self.config.epilogue
        # (bM, bN, RestM, RestN, RestL) output tiles (gated: bN / 2 output columns; swapped: bM / 2)
        out_tiler = cute.slice_(self.tile_shape_mnk, (None, None, 0))
        if cutlass.const_expr(self.out_div != (1, 1)):
            out_tiler = (self.config.tile_m // self.out_div[0], self.config.tile_n // self.out_div[1])
        gC_mnl = cute.local_tile(mC_mnl, out_tiler, (None, None, None))
        # (bM, bN, RestM, RestN, RestL): global (m, n, l) GEMM coordinate of every accumulator
        cAcc_mnl = None
        if cutlass.const_expr(epi.needs_coords):
            # grouped: (packed row, GEMM column, expert), offset per tile by the expert's first row
            if cutlass.const_expr(self.config.swap_ab):  # (token, GEMM column, expert) per element
                cAcc_mnl = self.swap.swap_acc_space(mA_mkl, mB_nkl, cute.slice_(self.tile_shape_mnk, (None, None, 0)))
            else:
                cAcc_mnl = cute.local_tile(
                    grouped_acc_space(mC_mnl, mB_nkl)
                    if cutlass.const_expr(self.config.grouped)
                    else cute.make_identity_tensor(self.acc_space(mC_mnl, mB_nkl).shape),
                    cute.slice_(self.tile_shape_mnk, (None, None, 0)),
                    (None, None, None),
                )

        # TMA partitions. A is multicast along the cluster's N mode, B along its M mode.
        a_cta_layout = cute.make_layout(cute.slice_(cta_layout_mnk, (0, None, 0)).shape)
        b_cta_layout = cute.make_layout(cute.slice_(cta_layout_mnk, (None, 0, 0)).shape)
        sA_load, gA_load = sA, gA_mkl
        if cutlass.const_expr(self.config.a_rows):  # config.a_rows: the first a_rows rows of every stage
            box = self.a_box_staged()
            sA_load = storage.sA.get_tensor(box.outer, swizzle=box.inner)
            gA_load = cute.local_tile(mA_mkl, (self.a_box_rows, self.tile_shape_mnk[2]), (None, None, None))
        # (TMA, STAGE), (TMA, RestM, RestK, RestL)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a,
            cluster_coord_mnk[1],
            a_cta_layout,
            cute.group_modes(sA_load, 0, 2),
            cute.group_modes(gA_load, 0, 2),
        )
        cfg = self.config
        tBsB = tBgB = None  # swap_ab: the tokens load in 32-row chunks (``swap_token_loads``)
        if cutlass.const_expr(not cfg.swap_ab):
            # (TMA, STAGE), (TMA, RestN, RestK, RestL)
            tBsB, tBgB = cpasync.tma_partition(
                tma_atom_b,
                cluster_coord_mnk[0],
                b_cta_layout,
                cute.group_modes(sB, 0, 2),
                cute.group_modes(gB_nkl, 0, 2),
            )
        k_tile_cnt = cute.size(gA_mkl, mode=[3])
        a_tiles = tAgA
        if cutlass.const_expr(cfg.swap_ab):
            # Tiles over (weights: M, tokens: N): the table counts each expert's token tiles
            # times the cluster tiles along the weights.
            tile_start, n_cluster_tiles = tile_table(storage.tile_start, mA_mkl.shape[0], cfg.tile_m, cfg.cluster_m)
            if warp_idx == 0:
                fill_tile_starts(tile_start, mOffs, mB_nkl.shape[0], cfg.tile_n, n_cluster_tiles, cute.arch.lane_idx())
        elif cutlass.const_expr(cfg.grouped):
            # The tile map lives in shared memory, built by warp 0 from offs (no host sync).
            tile_start, n_cluster_tiles = tile_table(
                storage.tile_start, self.acc_space(mC_mnl, mB_nkl).shape[1], cfg.tile_n, cfg.cluster_n
            )
            if warp_idx == 0:
                fill_tile_starts(
                    tile_start, mOffs, self.packed_rows(mA_mkl, mAIdx), cfg.tile_m * cfg.cluster_m, n_cluster_tiles,
                    cute.arch.lane_idx(),
                )
        if cutlass.const_expr(cfg.listed):
            # List form: mOffs is the group table (``gemm.grouped_parts.list_tile_table``).
            tile_start, num_groups = list_tile_table(storage.tile_start, mOffs, warp_idx)
        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)
        if cutlass.const_expr(cfg.split_cluster):
            cute.arch.cluster_wait()
            self.split.split_cluster_arm(storage.split_mbar.data_ptr(), tidx, True)
        if cutlass.const_expr(cfg.swap_ab):
            sched = make_grouped_scheduler(tile_start, mOffs, mB_nkl.shape[0], n_cluster_tiles, cfg)
        elif cutlass.const_expr(cfg.grouped):
            sched = make_grouped_scheduler(tile_start, mOffs, self.packed_rows(mA_mkl, mAIdx), n_cluster_tiles, cfg)

            def a_tiles(tile):
                """(TMA, RestK) A k-tiles of a grouped tile: rows from the expert's first row."""
                a_tiler = cute.slice_(self.tile_shape_mnk, (None, 0, None))
                return grouped_k_tiles(tma_atom_a, cluster_coord_mnk[1], a_cta_layout, sA, mA_mkl, a_tiler, tile)
        elif cutlass.const_expr(cfg.listed):
            sched = make_list_scheduler(tile_start, mOffs, num_groups, cfg.tile_m)
        else:
            sched = self.make_scheduler(self.acc_space(mC_mnl, mB_nkl), (cfg.tile_m, cfg.tile_n))
        b_tiles, load_k_tiles, k_range, k_first = tBgB, k_tile_cnt, None, None
        if cutlass.const_expr(cfg.split_k > 1):  # each unit's K range (gemm.sm90.split)
            k_range, load_k_tiles, k_first = self.split.split_k_roles(k_tile_cnt)
        load_descs = out_desc = None
        if cutlass.const_expr(cfg.listed):
            # Each group's own K-tile count and descriptors (zero fill past K, M, N; no store outside).
            load_k_tiles, load_descs, out_desc = list_roles(mOffs, num_groups, self.tile_shape_mnk[2])

            def k_range(tile):
                return load_k_tiles(tile), 0, 0
        if cutlass.const_expr(cfg.kgrouped):
            # K-grouped: tile (m, n, l) of expert l reads A's and B's K columns [k_start, k_end)
            # from offs (clamped as the grouped rows are). The TMA boxes start at k0, k_start
            # rounded down to 16 bytes (a box whose contiguous-mode coordinate is not 16-byte
            # aligned faulted with an illegal instruction on the H200); columns [k0, k_start) of
            # the first K tile and those past k_end in the last belong to other experts and are
            # zeroed in shared memory before the WGMMAs.
            # (gathering: the index's K positions; the gathered operand holds the tokens)
            total_k = mAIdx.shape[0] if cfg.gathers else mA_mkl.shape[1]
            tile_k = self.tile_shape_mnk[2]
            k_align = 16 * 8 // self.a_dtype.width

            def k_window(tile):
                """(k0, k_start, k_end): the expert's K range and the aligned first box column."""
                k_start, k_end = group_range(mOffs, tile[2], total_k)
                return k_start - k_start % k_align, k_start, k_end

            def a_tiles(tile):
                a_tiler = cute.slice_(self.tile_shape_mnk, (None, 0, None))
                return offset_k_tiles(
                    tma_atom_a, cluster_coord_mnk[1], a_cta_layout, sA, mA_mkl, a_tiler, tile[0], (0, k_window(tile)[0], 0)
                )

            def b_tiles(tile):
                b_tiler = cute.slice_(self.tile_shape_mnk, (0, None, None))
                return offset_k_tiles(
                    tma_atom_b, cluster_coord_mnk[0], b_cta_layout, sB, mB_nkl, b_tiler, tile[1], (0, k_window(tile)[0], 0)
                )

            def k_range(tile):
                """(K tiles of the tile's expert (0 when its range is empty), columns to zero at the
                start of the first K tile, K values of a partial last K tile or 0)."""
                k0, k_start, k_end = k_window(tile)
                n_k = cutlass.select_(k_end > k_start, (k_end - k0 + tile_k - 1) // tile_k, 0)
                return n_k, k_start - k0, (k_end - k0) % tile_k

            def load_k_tiles(tile):
                return k_range(tile)[0]

        load_sched = sched
        if cutlass.const_expr(cfg.scheduler != "static"):
            # The producer warp of cluster rank 0 fetches tiles; every role reads them from the ring.
            sched = self.broadcast_scheduler(sched, storage, mWorkspace)
            load_sched = sched.as_fetcher(cta_rank_in_cluster == 0)

        # Quantized output: (scale bytes, global scale, output rows, output columns).
        quant_args = (mEpiSF, mEpiGS, mC_mnl.shape[0], mC_mnl.shape[1] * self.out_per_elem)
        vectors = (mV0, mV1, mV2, mV3)  # user epilogue vectors, or (scale_a, scale_b) of FP8
        block_scales = (mSFA, mSFB)
        mx_parts = None
        if cutlass.const_expr(cfg.fp8_mx):
            sSFA, sSFB, mx_parts = self.mx.mx_partition(storage, tma_atom_sfa, mSFA, tma_atom_sfb, mSFB)
            block_scales = (sSFA, sSFB)
        if cutlass.const_expr(cfg.fp8_blockwise):
            sfb_stages = storage.sSFB.get_tensor(self.blockwise.sfb_layout()) if cfg.sfb_cols else mSFB
            block_scales = (storage.sSFA.get_tensor(self.blockwise.sfa_layout()), sfb_stages)
        warp_group_idx = cute.arch.make_warp_uniform(tidx // self.threads_per_warpgroup)
        if warp_group_idx == 0:
            cute.arch.setmaxregister_decrease(self.load_registers)
            if cutlass.const_expr(cfg.gathers and cfg.kgrouped):  # the whole warpgroup loads (gemm.sm90.gather)
                self.gather.load_k(load_sched, ab_pipeline, k_range, k_window, mA_rows, mAIdx,
                                   *((sB, tma_atom_a, a_tiles, tAsA, a_mcast_mask) if cfg.gather_b
                                     else (sA, tma_atom_b, b_tiles, tBsB, b_mcast_mask)),
                                   tidx, warp_idx)  # fmt: skip
            elif cutlass.const_expr(cfg.gather_a):  # the whole warpgroup loads (gemm.sm90.gather)
                self.gather.load(load_sched, ab_pipeline, k_tile_cnt, mA_rows, mAIdx, sA, tma_atom_b, tBgB, tBsB,
                                 b_mcast_mask, tidx, warp_idx)  # fmt: skip
            elif warp_idx == self.load_warp_id:
                extra = ()
                if cutlass.const_expr(cfg.fp8_mx):
                    extra = self.mx.mx_load_operands(tma_atom_sfa, tma_atom_sfb, mx_parts, mSFA, block_scales[0])
                if cutlass.const_expr(cfg.fp8_blockwise):
                    extra = (self.blockwise.sfa_load_operand(tma_atom_sfa, mSFA, block_scales[0]),)
                    if cutlass.const_expr(cfg.sfb_cols):
                        extra = (*extra, self.blockwise.sfb_load_operand(tma_atom_sfb, mSFB, block_scales[1]))
                b_atom, tx_bytes = tma_atom_b, None
                if cutlass.const_expr(cfg.swap_ab):  # the tokens, chunk by chunk
                    extra, tx_bytes = self.swap.swap_token_loads(tma_atom_b, sB, mB_nkl, b_mcast_mask)
                    b_atom = None
                self.load_ab(
                    load_sched, ab_pipeline, load_k_tiles,
                    tma_atom_a, a_tiles, tAsA, a_mcast_mask,
                    b_atom, b_tiles, tBsB, b_mcast_mask, extra, load_descs, tx_bytes, k_first,
                )  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(self.mma_registers)
            split = None  # split K: (workspace, shared-memory flag "this unit completes the tile")
            if cutlass.const_expr(cfg.split_cluster):  # in a cluster: (receive slots, their mbarrier)
                split = (storage.split_recv.get_tensor(cute.make_layout(self.split.split_recv_floats())),
                         storage.split_mbar.data_ptr())  # fmt: skip
            elif cutlass.const_expr(cfg.split_k > 1):
                split = (mWorkspace, storage.split_flag.get_tensor(cute.make_layout(4)))
            # pingpong: warpgroup 1 or 2 -> 0 / 1, each owning whole tiles; cooperative: one group.
            wg = warp_group_idx - 1 if self.pingpong else 0
            self.consumers.mma_and_epilogue(
                sched, ab_pipeline, k_tile_cnt, tiled_mma, sA, sB, sC, gC_mnl, tma_atom_c, alpha,
                (tidx - self.threads_per_warpgroup) % self.threads_per_tile, wg, warp_idx,
                cAcc_mnl, mCin, mBias, beta, mC_mnl, mC_gmem, quant_args, vectors,
                (mA_mkl if cutlass.const_expr(cfg.swap_ab) else mB_nkl).shape[0] if cutlass.const_expr(cfg.grouped) else None,
                block_scales=block_scales,
                k_range=k_range,
                out_desc=out_desc,
                split=split,
                preact=preact,
            )  # fmt: skip

    def packed_rows(self, mA: cute.Tensor, mAIdx: cute.Tensor | None):
        """The grouped form's packed rows: A's (gather_a: the index's; A holds the rows it points at)."""
        return mAIdx.shape[0] if self.config.gather_a else mA.shape[0]

    def acc_space(self, mC: cute.Tensor, mB: cute.Tensor):
        """What the tiles cover: the (M, N, L) output, or for gated / packed outputs an (M, N, L)
        identity tensor over the GEMM's columns (mB is (N, K, L))."""
        if self.config.epilogue.cols_per_output * self.out_per_elem == 1:
            return mC
        return cute.make_identity_tensor((mC.shape[0], mB.shape[0], mC.shape[2]))


