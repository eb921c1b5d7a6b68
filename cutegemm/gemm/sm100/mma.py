"""The MMA warp of the sm_100a kernel: per tile, wait for the stage ring, issue tcgen05 MMAs into
the tile's TMEM accumulator stage (block-scaled: through ``BlockScaledMma``), then hand the
stage to the epilogue warps."""

from __future__ import annotations

import inspect

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import tcgen05


class Sm100MmaWarp:
    """The MMA warp's role."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    # ---------------------------------------------------------------------------------------
    @cute.jit
    def mma(
        self,
        sched,
        ab_pipeline: pipeline.PipelineAsync,
        acc_pipeline: pipeline.PipelineAsync,
        tmem: memory.TmemAllocator,
        tiled_mma: cute.TiledMma,
        acc_layout: cute.Layout,  # (MMA, MMA_M, MMA_N, ACC_STAGE)
        sA: cute.Tensor,
        sB: cute.Tensor,
        k_tile_cnt,  # Int32, or tile -> Int32 (list form: each group's own K)
        is_leader_cta: cutlass.Boolean,
    ):
        """MMA warp: tcgen05.mma of every k-tile into the current TMEM accumulator stage.

        In 2-CTA mode only the leader CTA issues; its commits arrive on the barriers of both CTAs
        (stage empty: every CTA that received the multicast; acc full: the pair).
        """
        # (MMA, MMA_M, MMA_K, STAGE), (MMA, MMA_N, MMA_K, STAGE): smem descriptors
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        num_k_blocks = cute.size(tCrA, mode=[2])
        tmem.wait_for_alloc()
        # (MMA, MMA_M, MMA_N, ACC_STAGE)
        tCtAcc_base = cute.make_tensor(tmem.retrieve_ptr(self.k.acc_dtype), acc_layout)

        ab_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.k.ab_stage)
        acc_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.k.acc_stage)
        work = sched.first()
        while sched.is_valid(work):
            # (MMA, MMA_M, MMA_N)
            tCtAcc = tCtAcc_base[(None, None, None, acc_producer_state.index)]
            if is_leader_cta:
                # The epilogue (of both CTAs) has drained this accumulator stage.
                acc_pipeline.producer_acquire(acc_producer_state)
            # First k-block of a tile overwrites the accumulator.
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            kt_cnt = k_tile_cnt
            if cutlass.const_expr(inspect.isfunction(k_tile_cnt)):
                kt_cnt = k_tile_cnt(sched.cta_tile(work))
            for _k_tile in cutlass.range(kt_cnt, unroll=1):
                if is_leader_cta:
                    ab_pipeline.consumer_wait(ab_consumer_state)
                    for kb in cutlass.range_constexpr(num_k_blocks):
                        coord = (None, None, kb, ab_consumer_state.index)
                        cute.gemm(tiled_mma, tCtAcc, tCrA[coord], tCrB[coord], tCtAcc)
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                    # tcgen05.commit: the stage is freed once these MMAs have read it.
                    ab_pipeline.consumer_release(ab_consumer_state)
                ab_consumer_state.advance()
            if is_leader_cta:
                # tcgen05.commit: the accumulator is full once every MMA of the tile completed.
                acc_pipeline.producer_commit(acc_producer_state)
            acc_producer_state.advance()
            work = sched.next(work)
        # The peer CTA's epilogue arrives remotely on our empty barriers: wait for them before exit.
        acc_pipeline.producer_tail(acc_producer_state)
