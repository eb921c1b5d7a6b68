"""Inline-PTX helpers shared by hand-written kernel parts (the FP4-weight kernel, the sm_90a
MXFP8 emulation): vector loads with cache hints, cp.async, shared-memory vector loads."""

from __future__ import annotations

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def i32(v, loc=None, ip=None):
    return cutlass.Int32(v).ir_value(loc=loc, ip=ip)


def i64(v, loc=None, ip=None):
    return cutlass.Int64(v).ir_value(loc=loc, ip=ip)


def asm(
    ptx: str, ins: list, constraints: str, n_out: int = 0, out=cutlass.Int32, effects=False, loc=None, ip=None
):
    """One inline-PTX statement: ``ins`` are MLIR values, ``n_out`` results of DSL type ``out``
    (None for none, the value for one, a list for several)."""
    ty = T.f32() if out is cutlass.Float32 else T.i32()
    res_ty = None if n_out == 0 else ty if n_out == 1 else llvm.StructType.get_literal([ty] * n_out)
    res = llvm.inline_asm(res_ty, ins, ptx, constraints, has_side_effects=effects, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT)  # fmt: skip
    if n_out <= 1:
        return None if n_out == 0 else out(res)
    return [out(llvm.extractvalue(ty, res, [i], loc=loc, ip=ip)) for i in range(n_out)]


V4 = "{$0, $1, $2, $3}"


def _l2(l2_prefetch: int) -> str:
    return f".L2::{l2_prefetch}B" if l2_prefetch else ""


@dsl_user_op
def ld_global_v4_stream(addr, l2_prefetch: int = 0, *, loc=None, ip=None):
    """Four 32-bit words from a 16-byte aligned global address, not allocated in L1 (with an L2
    prefetch-size hint of 128 / 256 bytes if given)."""
    ptx = f"ld.global.nc.L1::no_allocate{_l2(l2_prefetch)}.v4.b32 {V4}, [$4];"
    return asm(ptx, [i64(addr, loc, ip)], "=r,=r,=r,=r,l", 4, loc=loc, ip=ip)


@dsl_user_op
def ld_global_v4(addr, *, loc=None, ip=None):
    """Four 32-bit words from a 16-byte aligned global address (read-only path, L1 cached)."""
    return asm(
        f"ld.global.nc.v4.b32 {V4}, [$4];", [i64(addr, loc, ip)], "=r,=r,=r,=r,l", 4, loc=loc, ip=ip
    )


@dsl_user_op
def ld_global_cg_f32(addr, *, loc=None, ip=None):
    """One fp32 from global memory through L2 only (``.cg``: another CTA's fresh store)."""
    return asm("ld.global.cg.f32 $0, [$1];", [i64(addr, loc, ip)], "=f,l", 1, out=cutlass.Float32, effects=True,
                loc=loc, ip=ip)  # fmt: skip


@dsl_user_op
def ld_global_cg_v4_f32(addr, *, loc=None, ip=None):
    """Four fp32 from a 16-byte aligned global address through L2 only (another CTA's fresh store)."""
    return asm(f"ld.global.cg.v4.f32 {V4}, [$4];", [i64(addr, loc, ip)], "=f,=f,=f,=f,l", 4, out=cutlass.Float32,
                effects=True, loc=loc, ip=ip)  # fmt: skip


@dsl_user_op
def st_global_cg_v4_f32(addr, values, *, loc=None, ip=None):
    """Four fp32 to a 16-byte aligned global address, cached in L2 only (read back by another CTA)."""
    ins = [i64(addr, loc, ip)] + [cutlass.Float32(v).ir_value(loc=loc, ip=ip) for v in values]
    asm("st.global.cg.v4.f32 [$0], {$1, $2, $3, $4};", ins, "l,f,f,f,f", effects=True, loc=loc, ip=ip)


@dsl_user_op
def st_global_v4(addr, words, *, loc=None, ip=None):
    """Four 32-bit words to a 16-byte aligned global address."""
    ins = [i64(addr, loc, ip)] + [i32(w, loc, ip) for w in words]
    asm("st.global.v4.b32 [$0], {$1, $2, $3, $4};", ins, "l,r,r,r,r", effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_global_u8(addr, *, loc=None, ip=None):
    return asm("ld.global.nc.u8 $0, [$1];", [i64(addr, loc, ip)], "=r,l", 1, loc=loc, ip=ip)


@dsl_user_op
def ld_global_u16(addr, *, loc=None, ip=None):
    return asm("ld.global.nc.u16 $0, [$1];", [i64(addr, loc, ip)], "=r,l", 1, loc=loc, ip=ip)


@dsl_user_op
def cp_async(smem_addr, gmem_addr, size: int, l2_prefetch: int = 0, *, loc=None, ip=None):
    """``size`` (4 or 16) bytes global -> shared, asynchronous (16: not cached in L1)."""
    kind = "cg" if size == 16 else "ca"
    ptx = f"cp.async.{kind}.shared.global{_l2(l2_prefetch)} [$0], [$1], {size};"
    asm(ptx, [i32(smem_addr, loc, ip), i64(gmem_addr, loc, ip)], "r,l", effects=True, loc=loc, ip=ip)


@dsl_user_op
def cp_async_commit(*, loc=None, ip=None):
    asm("cp.async.commit_group;", [], "", effects=True, loc=loc, ip=ip)


@dsl_user_op
def cp_async_wait(n: int, *, loc=None, ip=None):
    asm(f"cp.async.wait_group {n};", [], "", effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_shared_v4(addr, *, loc=None, ip=None):
    return asm(
        f"ld.shared.v4.b32 {V4}, [$4];",
        [i32(addr, loc, ip)],
        "=r,=r,=r,=r,r",
        4,
        effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_shared_v4(addr, words, *, loc=None, ip=None):
    """Four 32-bit words to a 16-byte aligned shared-memory address (its 32-bit offset)."""
    ins = [i32(addr, loc, ip)] + [i32(w, loc, ip) for w in words]
    asm("st.shared.v4.b32 [$0], {$1, $2, $3, $4};", ins, "r,r,r,r,r", effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_shared_b32(addr, *, loc=None, ip=None):
    return asm("ld.shared.b32 $0, [$1];", [i32(addr, loc, ip)], "=r,r", 1, effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_shared_v4_f32(addr, *, loc=None, ip=None):
    """Four fp32 from a 16-byte aligned shared-memory address (``addr``: its 32-bit offset)."""
    return asm(f"ld.shared.v4.f32 {V4}, [$4];", [i32(addr, loc, ip)], "=f,=f,=f,=f,r", 4, out=cutlass.Float32,
                effects=True, loc=loc, ip=ip)  # fmt: skip


@dsl_user_op
def ld_shared_u8(addr, *, loc=None, ip=None):
    return asm("ld.shared.u8 $0, [$1];", [i32(addr, loc, ip)], "=r,r", 1, effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_shared_u16(addr, *, loc=None, ip=None):
    return asm("ld.shared.u16 $0, [$1];", [i32(addr, loc, ip)], "=r,r", 1, effects=True, loc=loc, ip=ip)


@dsl_user_op
def bulk_g2s(smem_addr, gmem_addr, size, mbar_addr, *, loc=None, ip=None):
    """``cp.async.bulk`` of ``size`` bytes (a multiple of 16; both addresses 16-byte aligned)
    global -> shared, completing ``size`` transaction bytes on the shared-memory mbarrier at
    ``mbar_addr`` (32-bit shared offsets)."""
    ptx = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];"
    ins = [i32(smem_addr, loc, ip), i64(gmem_addr, loc, ip), i32(size, loc, ip), i32(mbar_addr, loc, ip)]
    asm(ptx, ins, "r,l,r,r", effects=True, loc=loc, ip=ip)


@dsl_user_op
def st_async_cluster_v4_f32(smem_addr, mbar_addr, rank, values, *, loc=None, ip=None):
    """Four fp32 into CTA ``rank``'s shared memory (``smem_addr``: the same offset in this CTA's
    window, 16-byte aligned) by ``st.async``; the 16 bytes complete on that CTA's mbarrier at
    ``mbar_addr`` (this CTA's window address of it)."""
    ins = [i32(smem_addr, loc, ip), i32(mbar_addr, loc, ip), i32(rank, loc, ip)]
    ins += [cutlass.Float32(v).ir_value(loc=loc, ip=ip) for v in values]
    ptx = ("{\n.reg .b32 ra, rb;\nmapa.shared::cluster.u32 ra, $0, $2;\nmapa.shared::cluster.u32 rb, $1, $2;\n"
           "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [ra], {$3, $4, $5, $6}, [rb];\n}")  # fmt: skip
    asm(ptx, ins, "r,r,r,f,f,f,f", effects=True, loc=loc, ip=ip)


def _wgmma_rs_ptx(n: int) -> str:
    na = n // 2
    d = ", ".join(f"${i}" for i in range(na))
    a = ", ".join(f"${na + i}" for i in range(4))
    return (
        "{\n.reg .pred p;\n"
        f"setp.ne.b32 p, ${na + 5}, 0;\n"
        f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d}}}, {{{a}}}, ${na + 4}, p, 1, 1, 0;\n}}"
    )


@dsl_user_op
def wgmma_rs_bf16(acc, a, desc_b, n: int, *, loc=None, ip=None):
    """``wgmma.mma_async`` m64 x ``n`` x k16, bf16 in, fp32 accumulate (always adds into ``acc``:
    ``n / 2`` fp32 per thread, the D fragment order), A from registers (``a``: four bf16x2 words,
    the m16n8k16 A fragment of the warp's 16 rows), B from shared memory (``desc_b``: a 64-bit
    matrix descriptor, K-major). Returns the new accumulators. The caller fences
    (``warpgroup.fence``) before, commits and waits after."""
    na = n // 2
    ins = [i32(w, loc, ip) for w in a] + [i64(desc_b, loc, ip), i32(1, loc, ip)]
    ins += [cutlass.Float32(v).ir_value(loc=loc, ip=ip) for v in acc]
    cons = ",".join(["=f"] * na + ["r"] * 4 + ["l", "r"] + [str(i) for i in range(na)])
    return asm(_wgmma_rs_ptx(n), ins, cons, na, out=cutlass.Float32, effects=True, loc=loc, ip=ip)


def smem_desc_sw128(addr):
    """The wgmma matrix descriptor of a K-major operand in 128-byte swizzled atoms (8 rows x 128
    bytes, 1024-byte aligned) starting at shared address ``addr`` (a K step inside the atom adds
    its byte offset / 16): start address >> 4, leading byte offset 1 (unused here), stride byte
    offset 1024 >> 4 between 8-row groups, layout type 1 (128-byte swizzle)."""
    lo = ((cutlass.Int32(addr) >> 4) & 0x3FFF) | (1 << 16)
    return (cutlass.Int64(64 | (1 << 30)) << 32) | cutlass.Int64(lo)
