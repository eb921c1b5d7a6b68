"""Swap AB for the packed grouped GEMM on sm_90a (``GemmConfig.swap_ab``), a part of ``GemmSm90``.

The kernel computes C^T = B^T A^T: its A operand is the experts' weights viewed (N, K, E), its
B operand the packed tokens (total_M, K, 1), and its C the output viewed (N, total_M, 1)
(M-major: the stmatrix copies transpose). A tile is tile_m weight columns x up to tile_n tokens
of one expert; the grouped scheduler runs over the tokens (``GroupedScheduler`` with ``swap``),
each expert's tokens split evenly over its ceil(tokens / tile_n) tiles (the tiles that share a
weight tile then run at one speed and read it from L2 together).

What it buys: WGMMA's N can be any multiple of 8, its M only 64. With tokens along N, a tile
of w tokens issues WGMMAs of width ceil(w / 16) * 16 (one K loop per width, picked at run time
on a warp-uniform value), and loads its tokens in 32-row TMA chunks, only the chunks it has
(the stage's expected byte count is the tile's own; chunks zero-filled by an out-of-bounds box
instead were not free on the H200). A ragged expert's tiles then cost tensor work and token
loads in proportion to its real tokens. In the usual orientation its last tile costs a whole
128-row tile of both, which the H200 pays at its power limit (448 rows per expert took as long as
512).

Epilogue: the subtiles are 128 weights x 32 tokens; those past the expert's last token are
skipped, a subtile that crosses it is stored by predicated copies, the rest by TMA. Gated
outputs (swiglu / geglu): a (gate, up) pair is two adjacent GEMM columns, here two adjacent
accumulator rows, which WGMMA gives to lanes 4 apart; one shuffle per token pairs them
(:meth:`swap_gated_store`), and a subtile stores 64 output columns x 32 tokens.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

from ...config import SWAP_CHUNK, SWAP_STEP
from ...epilogue.ops import apply_gate, static_offsets
from ..store import store_subtile_predicated


class SwapAb:
    """Device helpers of the swapped grouped kernel (see the module docstring)."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    def swap_token_loads(self, tma_atom_b, sB: cute.Tensor, mB: cute.Tensor, b_mcast_mask):
        """The token operand as ``load_ab`` extra operands, and the per-tile byte count of a stage:
        (ops, tile -> bytes). One operand per 32-token chunk this CTA issues (chunk j by CTA
        j % cluster_m, multicast to the cluster), each ``(atom, tile -> (TMA, RestK), smem (TMA,
        STAGE), mask, tile -> loaded)``: a chunk past the tile's last token is not loaded (the
        WGMMA width never reaches it), and every CTA of the cluster expects A's box plus the
        tile's chunks."""
        cfg = self.k.config
        tile_k = self.k.tile_shape_mnk[2]
        # (CHUNK, K, chunks, 1, STAGE)
        s_div = cute.flat_divide(sB, (SWAP_CHUNK, tile_k))
        ops = []
        s_0 = s_div[(None, None, 0, 0, None)]  # (the gmem partitions need a box's layout only)
        for i in range(cfg.tile_n // SWAP_CHUNK // cfg.cluster_m):
            smem, _ = self._chunk_partition(tma_atom_b, s_div[(None, None, self._chunk(i), 0, None)], mB, 0, (0, 0, 0))

            def g_tiles(tile, i=i):
                return self._chunk_partition(tma_atom_b, s_0, mB, self._chunk(i), (self._tile_tokens(tile)[0], 0, 0))[1]

            def loaded(tile, i=i):
                return self._chunk(i) < self._tile_tokens(tile)[1]

            ops.append((tma_atom_b, g_tiles, smem, b_mcast_mask, loaded))
        a_bytes = self.k.config.tile_m * tile_k * self.k.a_dtype.width // 8  # A's box (zero-filled past N too)
        chunk_bytes = SWAP_CHUNK * tile_k * self.k.b_dtype.width // 8

        def tx_bytes(tile):
            return a_bytes + self._tile_tokens(tile)[1] * chunk_bytes

        return ops, tx_bytes

    def _chunk(self, i: int):
        """The tile chunk that this CTA issues i-th (chunk j is issued by CTA j % cluster_m)."""
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster()) % self.k.config.cluster_m
        return i * self.k.config.cluster_m + rank

    def _tile_tokens(self, tile):
        """(first token, 32-token chunks) of a swapped tile: its tokens are [tile[3], tile[4])
        (the scheduler's even split; at most tile_n, the min a guard)."""
        return tile[3], (cutlass.min(tile[4] - tile[3], self.k.config.tile_n) + (SWAP_CHUNK - 1)) // SWAP_CHUNK

    def _chunk_partition(self, tma_atom_b, s_j, mB, chunk, origin):
        """(smem (TMA, STAGE), gmem (TMA, RestK)) of token chunk ``chunk`` counted from ``origin``
        (the partition of ``gemm.grouped_parts.offset_k_tiles``, 32-row boxes)."""
        tiler = (SWAP_CHUNK, self.k.tile_shape_mnk[2])
        g = cute.local_tile(cute.domain_offset(origin, mB), tiler, (None, None, None))
        smem, gm = cpasync.tma_partition(
            tma_atom_b, 0, cute.make_layout(1), cute.group_modes(s_j, 0, 2), cute.group_modes(g, 0, 2)
        )
        return smem, gm[(None, chunk, None, 0)]

    def swap_variants(self, tiled_mma, mma_tidx, sA: cute.Tensor, sB: cute.Tensor, acc: cute.Tensor,
                      acc_sum: cute.Tensor, promote: bool):  # fmt: skip
        """One (tiled MMA, A fragment, B fragment, accumulator view, promoted-sum view) per WGMMA
        width 16, 32, ..., tile_n: the B fragment reads the stage's first n token rows, the
        accumulator views are the first n / 2 fp32 registers of each thread's (the WGMMA fragment
        is ordered by column); the promoted sum (FP8) is viewed the same way. ``promote``: the
        partial sum is zeroed here once (each K tile accumulates from zeros: :meth:`swap_k_loop`)."""
        cfg = self.k.config
        tile_k = self.k.tile_shape_mnk[2]
        stages = cute.size(sB, mode=[2])
        out = []
        for i in range(cfg.tile_n // SWAP_STEP):
            n = SWAP_STEP * (i + 1)
            mma = sm90_utils.make_trivial_tiled_mma(
                self.k.a_dtype, self.k.b_dtype, self.k.swap_majors[0], self.k.swap_majors[1], self.k.acc_dtype,
                self.k.atom_layout_mnk, tiler_mn=(64, n),
            )  # fmt: skip
            thr = mma.get_slice(mma_tidx)
            s_n = cute.composition(sB, cute.make_layout((n, tile_k, stages), stride=(1, cfg.tile_n, cfg.tile_n * tile_k)))
            t_a = mma.make_fragment_A(thr.partition_A(sA))
            t_b = mma.make_fragment_B(thr.partition_B(s_n))
            layout = cute.make_layout(thr.partition_C(cute.make_identity_tensor((cfg.tile_m, n))).shape)
            out.append((mma, t_a, t_b, cute.make_tensor(acc.iterator, layout), cute.make_tensor(acc_sum.iterator, layout)))
        if promote:
            acc.fill(0.0)
        return out

    @cute.jit
    def swap_width_index(self, tile) -> cutlass.Int32:
        """Index into :meth:`swap_variants` of a tile: its tokens (at most tile_n) in 16s, minus 1."""
        left = tile[4] - tile[3]
        return cute.arch.make_warp_uniform((cutlass.min(left, self.k.config.tile_n) + (SWAP_STEP - 1)) // SWAP_STEP - 1)

    @cute.jit
    def swap_k_loop(self, ab_pipeline, read_state, release_state, variants, v: cutlass.Int32, kt_cnt: cutlass.Int32,
                    num_k_blocks: cutlass.Constexpr, my_wg: cutlass.Int32, promote: cutlass.Constexpr):  # fmt: skip
        """A tile's K loop at WGMMA width variant ``v`` (warp-uniform): one loop per width, so the
        WGMMAs of each stay batched (one group in flight, the stage behind it released).
        ``promote`` (FP8): every K tile's WGMMAs accumulate into a zeroed partial sum, added
        into the promoted sum once they retire, then zeroed again (the whole accumulator is zero
        between tiles: zeroed once before the first). Not the unswapped loop's first WGMMA
        without accumulate: with more than one width, ptxas then serialized every QGMMA. Either
        way slower than the unswapped promoted kernel on the H200 (DeepSeek-V3 up 1022 / 1054
        (serialized) vs 1218 TFLOP/s): the policy swaps FP8 only
        with fast accumulation."""
        for vi in cutlass.range_constexpr(len(variants)):
            if v == vi:
                mma, t_a, t_b, acc, acc_sum = variants[vi]
                mma.set(warpgroup.Field.ACCUMULATE, True)
                for k_tile in range(kt_cnt):
                    ab_pipeline.consumer_wait(read_state)
                    mma = self.k.consumers.issue_k_tile(mma, acc, t_a, t_b, read_state.index, num_k_blocks, False, my_wg)
                    release_state = self.k.consumers.retire_k_tile(ab_pipeline, read_state, release_state, k_tile, promote, acc,
                                                       acc_sum, rezero=True)  # fmt: skip
                    read_state.advance()
        return read_state, release_state

    @staticmethod
    def swap_acc_space(mA: cute.Tensor, mB: cute.Tensor, tile_mn):
        """(bM, bN, RestM, RestN, RestE) tiles of the accumulator coordinates of the swapped
        kernel, as the epilogue ops read them: element (i, j) of a tile is (token, GEMM column,
        expert), the transpose of the kernel's own (weight column, token) (mA: the weights (N, K,
        E), mB: the tokens (total_M, K, 1))."""
        ident = cute.make_identity_tensor((mB.shape[0], mA.shape[0], mA.shape[2]))
        return cute.local_tile(cute.make_tensor(ident.iterator, cute.select(ident.layout, mode=[1, 0, 2])), tile_mn,
                               (None, None, None))  # fmt: skip

    @staticmethod
    def swap_acc_coords(cAcc_tiles: cute.Tensor, tile) -> cute.Tensor:
        """(bM, bN) coordinates of swapped tile ``tile``'s accumulator (its tokens from tile[3])."""
        return cute.domain_offset((0, tile[3]), cAcc_tiles[(None, None, tile[0], 0, tile[2])])

    @staticmethod
    def swap_out_tile(mC: cute.Tensor, mC_gmem: cute.Tensor, tile, tile_mn):
        """(gC, gC_real, tokens_left, weights_left) of swapped grouped tile ``tile`` (the scheduler
        gives each tile its own token range [tile[3], tile[4]) and n_tile 0): the tile of the (N,
        total_M) output views from its first token, how many of its token columns belong to it
        and how many weight rows lie inside N (the latter may exceed the tile)."""
        m_tile, _, _, tok0, tok1 = tile
        gC = cute.local_tile(cute.domain_offset((0, tok0, 0), mC), tile_mn, (m_tile, 0, 0))
        gC_real = cute.local_tile(cute.domain_offset((0, tok0, 0), mC_gmem), tile_mn, (m_tile, 0, 0))
        return gC, gC_real, tok1 - tok0, mC_gmem.shape[0] - m_tile * tile_mn[0]

    @cute.jit
    def swap_store_partial(self, sC_buf: cute.Tensor, gC_sub: cute.Tensor, tokens_valid: cutlass.Int32,
                           weights_valid: cutlass.Int32, tidx: cutlass.Int32):  # fmt: skip
        """Predicated store of a subtile (weights x tokens, weights contiguous) that crosses the
        expert's last token: transposed views, so the 16-byte pieces run along the weights."""
        rows, cols = self.k.epi_tile_out
        t = cute.make_layout((cols, rows), stride=(rows, 1))
        store_subtile_predicated(
            cute.composition(sC_buf, t), cute.composition(gC_sub, t), tokens_valid, weights_valid, tidx,
            self.k.threads_per_tile,
        )

    @staticmethod
    def swap_gate_pairs(coords: cute.Tensor) -> list[tuple[int, int]]:
        """(register at row offset 0, register at row offset 8) per token of a thread's swapped
        subtile fragment (``coords``: (token, GEMM column, expert) per register). The WGMMA
        fragment holds rows r and r + 8 of every token column; proven at trace time (raises
        otherwise)."""
        index = {}
        for v, o in enumerate(static_offsets(coords)):
            if o[1] not in (0, 8) or (o[0], o[1]) in index:
                raise ValueError(f"swap_ab gated epilogue: unexpected fragment offset {o}")
            index[(o[0], o[1])] = v
        tokens = sorted({t for t, _ in index})
        if any((t, 0) not in index or (t, 8) not in index for t in tokens):
            raise ValueError(f"swap_ab gated epilogue: fragment offsets {sorted(index)} are not row pairs r, r + 8")
        return [(index[(t, 0)], index[(t, 8)]) for t in tokens]

    def swap_gated_store(self, spec, y: cute.TensorSSA, coords: cute.Tensor, local: cute.Tensor,
                         s_out: cute.Tensor, dtype):  # fmt: skip
        """Gate, then write one swapped subtile's outputs into ``s_out`` (64 output columns x 32
        tokens). ``y``: the subtile's fp32 values after alpha / bias (``coords`` order); local:
        subtile-local (weight row, token) of every register.

        Gate column 2j and up column 2j + 1 are accumulator rows of lanes 4 apart: a lane with
        even rows g, g + 8 holds gates, its partner (lane ^ 4) the ups of rows g + 1, g + 9. The
        even lane finishes pair (g, g + 1), the odd one pair (g + 8, g + 9): per token each sends
        the value the other needs (even: its gate of row g + 8; odd: its up of row g + 1), one
        shuffle. Output row = (the kept register's row) >> 1."""
        pairs = self.swap_gate_pairs(coords)
        odd = (coords[0][1] & 1) != 0  # this lane's rows hold ups (GEMM columns 2j + 1)
        r_y = cute.make_rmem_tensor(y.shape, cutlass.Float32)
        r_y.store(y)
        r_gate = cute.make_rmem_tensor(len(pairs), cutlass.Float32)
        r_up = cute.make_rmem_tensor(len(pairs), cutlass.Float32)
        for k, (v0, v8) in enumerate(pairs):
            a, b = r_y[v0], r_y[v8]
            got = cute.arch.shuffle_sync_bfly(cutlass.select_(odd, a, b), offset=4)
            r_gate[k] = cutlass.select_(odd, got, a)
            r_up[k] = cutlass.select_(odd, b, got)
        r_out = cute.make_rmem_tensor(len(pairs), dtype)
        r_out.store(apply_gate(spec, r_gate.load(), r_up.load()).to(dtype))
        for k, (v0, v8) in enumerate(pairs):
            row = cutlass.select_(odd, local[v8][0], local[v0][0]) >> 1
            s_out[(row, local[v0][1])] = r_out[k]
