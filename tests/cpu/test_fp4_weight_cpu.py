"""FP4-weight GEMM (W4A16) on the CPU: the kernel's register math (torch twins) is exact, the
fragment pairing reproduces the matmul, argument errors, and compile-checks for both archs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cutegemm
import cutegemm.ops  # noqa: F401  (registers torch.ops.cutegemm)
from cutegemm.blockscaled.reference import _E2M1_VALUES, dequantize_ref, quantize_ref
from cutegemm.blockscaled.weight_only import kernel as fw
from cutegemm.blockscaled.weight_only import math as fm
from cutegemm.blockscaled.weight_only import ring as fp4_ring
from cutegemm.blockscaled.weight_only.launch import check_args, gemm_fp4_weight_ref, pick_config

E2M1 = torch.tensor(_E2M1_VALUES + tuple(-v for v in _E2M1_VALUES), dtype=torch.float64)


def _words(codes: torch.Tensor) -> torch.Tensor:
    """(..., 8) nibble codes (k0 first) -> (...,) uint32 words as int64 (k0 in the low bits)."""
    shifts = torch.arange(8, dtype=torch.int64) * 4
    return (codes.to(torch.int64) << shifts).sum(-1)


def test_dequant_twin_nvfp4_exact_for_every_code_and_scale():
    codes = torch.arange(16).repeat(8)[:16].reshape(2, 8)  # all 16 codes
    for sbyte in range(256):
        if sbyte & 0x7F == 0x7F:  # NaN scale: checked separately
            continue
        scale = torch.tensor([sbyte], dtype=torch.uint8).view(torch.float8_e4m3fn).double()
        factor = fm.nvfp4_factor_ref(torch.tensor(sbyte))
        got = fm.dequant_words_ref(_words(codes), factor, two_muls=False).double()  # (2, 4, 2)
        want = E2M1[codes] * scale * 2.0**-8
        # word i holds (k_i, k_{i+4})
        want_pairs = torch.stack([want[:, :4], want[:, 4:]], dim=-1)
        assert torch.equal(got, want_pairs), sbyte


def test_dequant_twin_nvfp4_nan_scale_is_nan():
    got = fm.dequant_words_ref(_words(torch.arange(8)), fm.nvfp4_factor_ref(torch.tensor(0x7F)), False)
    assert torch.isnan(got).all()


@pytest.mark.parametrize("e", [0, 1, 2, 60, 126, 127, 128, 129, 200, 253, 254, 255])
def test_dequant_twin_mxfp4_exact_over_the_e8m0_range(e):
    codes = torch.arange(16).reshape(2, 8)
    got = fm.dequant_words_ref(_words(codes), fm.mx_scale_bf16_ref(torch.tensor(e)), two_muls=True).double()
    if e == 255:
        assert torch.isnan(got).all()
        return
    want = E2M1[codes] * 2.0 ** (e - 127)
    want = want.float().double()  # the reference dequantizes in fp32 (6 * 2**127 -> inf)
    want_pairs = torch.stack([want[:, :4], want[:, 4:]], dim=-1)
    assert torch.equal(got, want_pairs), e


def _simulate_chunk(codes: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, vec: int) -> torch.Tensor:
    """One warp's 128-wide K chunk as the kernel builds it: per lane (g, t) and step (j, h) the
    m16n8k16 A / B fragments (PTX fragment layouts) from the twins; returns D (16 rows, 8 tokens)."""
    d = torch.zeros(16, 8, dtype=torch.float64)
    for j in range(4):
        for h in range(2):
            A = torch.zeros(16, 16, dtype=torch.float64)
            B = torch.zeros(16, 8, dtype=torch.float64)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                words = []
                for row in (g, g + 8):
                    k0 = 32 * t + 8 * j
                    w = _words(codes[row, k0 : k0 + 8])
                    blk = k0 // vec
                    s = scales[row, blk]
                    if vec == 16:
                        f = fm.nvfp4_factor_ref(s)
                        dq = fm.dequant_words_ref(w, f, False).double() * 2.0**8
                    else:
                        dq = fm.dequant_words_ref(w, fm.mx_scale_bf16_ref(s), True).double()
                    words.append(dq)
                # a0a1 = row g word 2h, a2a3 = row g+8 word 2h, a4a5 = row g word 2h+1, a6a7 = row g+8 word 2h+1
                A[g, 2 * t : 2 * t + 2] = words[0][2 * h]
                A[g + 8, 2 * t : 2 * t + 2] = words[1][2 * h]
                A[g, 2 * t + 8 : 2 * t + 10] = words[0][2 * h + 1]
                A[g + 8, 2 * t + 8 : 2 * t + 10] = words[1][2 * h + 1]
                xk = x[g, 32 * t + 8 * j : 32 * t + 8 * j + 8].double()
                # b0b1 = (x_{2h}, x_{2h+4}) (prmt 0x5410), b2b3 = (x_{2h+1}, x_{2h+5}) (prmt 0x7632)
                B[2 * t, g], B[2 * t + 1, g] = xk[2 * h], xk[2 * h + 4]
                B[2 * t + 8, g], B[2 * t + 9, g] = xk[2 * h + 1], xk[2 * h + 5]
            d += A @ B
    return d


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fragment_pairing_reproduces_the_matmul(fmt):
    torch.manual_seed(0)
    vec = 16 if fmt == "nvfp4" else 32
    codes = torch.randint(0, 16, (16, 128))
    if fmt == "nvfp4":
        scales = torch.randint(0, 0x7F, (16, 128 // vec))  # e4m3 bytes, no NaN
        sval = scales.to(torch.uint8).view(torch.float8_e4m3fn).double()
    else:
        scales = torch.randint(100, 150, (16, 128 // vec))
        sval = 2.0 ** (scales.double() - 127)
    x = torch.randn(8, 128).to(torch.bfloat16)
    w = E2M1[codes] * sval.repeat_interleave(vec, dim=1)
    want = w @ x.double().T
    got = _simulate_chunk(codes, scales, x, vec)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k", [128, 256, 96, 32])
def test_fragment_order_x(k):
    rows = 5
    x = torch.arange(rows * k, dtype=torch.float32).reshape(rows, k).to(torch.bfloat16)
    xf = fm.fragment_order_x(x)
    kp = -(-k // 128) * 128
    assert xf.shape == (kp // 128 * 4, rows, 4, 8)
    xp = torch.nn.functional.pad(x, (0, kp - k))
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    for c in range(kp // 128):
        for j in range(4):
            for m in range(rows):
                for t in range(4):
                    base = 128 * c + 32 * t + 8 * j
                    assert torch.equal(xf[4 * c + j, m, t], xp[m, [base + o for o in order]])


def test_pair_natural_x_twin_gives_the_fragment_order():
    """The ring's PRMT pairing of activations read in K order (twin) = the host fragment order."""
    rows, k = 3, 256
    x = torch.randn(rows, k).to(torch.bfloat16)
    xf = fm.fragment_order_x(x)
    words = x.view(torch.int16).to(torch.int64).reshape(rows, k // 8, 4, 2) & 0xFFFF
    natural = words[..., 0] | (words[..., 1] << 16)  # (rows, K / 8, 4): 16-byte pieces in K order
    paired = fm.pair_natural_x_ref(natural)
    want = xf.view(torch.int16).to(torch.int64).reshape(k // 128, 4, rows, 4, 4, 2) & 0xFFFF
    want = want[..., 0] | (want[..., 1] << 16)  # (c, j, m, t, word)
    for c in range(k // 128):
        for j in range(4):
            for t in range(4):
                assert torch.equal(paired[:, 16 * c + 4 * t + j], want[c, j, :, t])


@settings(max_examples=300, deadline=None)
@given(n_segs=st.integers(1, 60), n_kst=st.integers(1, 24), ctas=st.integers(1, 400))
def test_split_plan_covers_every_unit_once(n_segs, n_kst, ctas):
    """The split grid's schedule (twin of the kernel's formulas): every unit in exactly one CTA's
    piece, pieces within one segment; a segment cut between CTAs lists exactly the CTAs holding
    its units (the counter waits for c_last - c_first + 1 arrivals) and each uses its own slot."""
    total = n_segs * n_kst
    ctas = min(ctas, total)
    plan = fp4_ring.split_plan_ref(total, ctas, n_kst)
    seen = [0] * total
    holders = {s: set() for s in range(n_segs)}
    for c, pieces in enumerate(plan):
        assert pieces, "every CTA gets work (n_ctas <= units)"
        slots = []
        for seg, a, b, whole, slot, c_first, c_last in pieces:
            assert seg * n_kst <= a < b <= (seg + 1) * n_kst
            for u in range(a, b):
                seen[u] += 1
            holders[seg].add(c)
            assert whole == (a == seg * n_kst and b == (seg + 1) * n_kst)
            if not whole:
                slots.append(slot)
                assert c_first <= c <= c_last
        assert len(slots) == len(set(slots)) <= 2
    assert seen == [1] * total
    for pieces in plan:
        for seg, _a, _b, whole, _slot, c_first, c_last in pieces:
            assert set(range(c_first, c_last + 1)) == holders[seg]
            assert whole == (c_first == c_last)


@settings(max_examples=300, deadline=None)
@given(n_segs=st.integers(1, 400), n_kst=st.integers(1, 70), grid=st.integers(1, 140))
def test_tail_plan_covers_every_unit_once(n_segs, n_kst, grid):
    """The pass grid with ``tail_split`` (twin of the kernel's formulas): every unit in exactly one
    CTA's piece; the full rounds' segments whole, round-robin; a tail segment cut between CTAs
    lists exactly the CTAs holding its units (the counter waits for c_last - c_first + 1
    arrivals), each with its own slot; a tail range holds TAIL_MIN_STAGES K stages at least
    (or the whole tail); the CTAs' shares of the units differ by at most one where the tail
    has TAIL_MIN_STAGES per CTA."""
    grid = min(grid, n_segs)  # the host's grid: at most one CTA per unit
    plan = fp4_ring.tail_plan_ref(n_segs, n_kst, grid)
    total = n_segs * n_kst
    seen = [0] * total
    holders = {s: set() for s in range(n_segs)}
    full = (n_segs // grid) * grid
    for c, pieces in enumerate(plan):
        slots, tail_units = [], 0
        for seg, a, b, whole, slot, _c_first, _c_last in pieces:
            assert seg * n_kst <= a < b <= (seg + 1) * n_kst
            for u in range(a, b):
                seen[u] += 1
            holders[seg].add(c)
            assert whole == (a == seg * n_kst and b == (seg + 1) * n_kst)
            if seg < full:
                assert whole and seg % grid == c
            else:
                tail_units += b - a
            if not whole:
                slots.append(slot)
        assert len(slots) == len(set(slots)) <= 2
        assert tail_units == 0 or tail_units >= min(fp4_ring.TAIL_MIN_STAGES, (n_segs - full) * n_kst)
    assert seen == [1] * total
    for pieces in plan:
        for seg, _a, _b, whole, _slot, c_first, c_last in pieces:
            if not whole:
                assert set(range(c_first, c_last + 1)) == holders[seg]
                assert c_first < c_last
    shares = [sum(b - a for _s, a, b, *_ in pieces) for pieces in plan]
    if (n_segs - full) * n_kst >= grid * fp4_ring.TAIL_MIN_STAGES:
        assert max(shares) - min(shares) <= 1


def test_split_rules_and_policy():
    base = dict(fmt="nvfp4", stages=0, ring=4, ring_k=2, warps_n=4, warps_k=2, row_tiles=2)
    assert fw.Fp4WeightConfig(**base, split=True).name.endswith("_split")
    with pytest.raises(ValueError):
        fw.Fp4WeightConfig(**base, split=True, grouped=True)
    with pytest.raises(ValueError):
        fw.Fp4WeightConfig(fmt="nvfp4", split=True)  # needs the ring
    assert not pick_config(16, "nvfp4", torch.bfloat16, "sm_90a", False).split  # one token pass
    assert pick_config(64, "nvfp4", torch.bfloat16, "sm_100a", False).split  # two passes of 32 (mma.sync consumers)
    assert pick_config(64, "nvfp4", torch.bfloat16, "sm_90a", False).split  # the WGMMA consumers, 64 tokens
    assert not pick_config(32, "nvfp4", torch.bfloat16, "sm_90a", False).split  # 32 tokens: one pass
    assert not pick_config(4096, "nvfp4", torch.bfloat16, "sm_90a", True, experts=32).split  # grouped


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 20),
    n=st.integers(1, 40),
    kb=st.integers(1, 6),
    fmt=st.sampled_from(["nvfp4", "mxfp4"]),
)
def test_reference_matches_dequantized_matmul(m, n, kb, fmt):
    k = 32 * kb
    torch.manual_seed(m * 1000 + n * 10 + kb)
    w = torch.randn(n, k)
    qw = quantize_ref(w, fmt)
    x = torch.randn(m, k).to(torch.bfloat16)
    got = gemm_fp4_weight_ref(x, qw, out_dtype=torch.float32)
    want = x.float() @ dequantize_ref(qw).T
    torch.testing.assert_close(got, want)
    # the public twins route here
    torch.testing.assert_close(cutegemm.gemm_ref(x, qw, out_dtype=torch.float32), want)


def test_grouped_reference_leaves_rows_past_the_last_offset_zero():
    torch.manual_seed(1)
    qw = quantize_ref(torch.randn(3, 24, 64), "nvfp4")
    x = torch.randn(20, 64).to(torch.bfloat16)
    offs = torch.tensor([4, 4, 15], dtype=torch.int32)
    got = cutegemm.grouped_gemm_ref(x, qw, offs=offs, out_dtype=torch.float32)
    w = dequantize_ref(qw)
    torch.testing.assert_close(got[:4], x[:4].float() @ w[0].T)
    torch.testing.assert_close(got[4:15], x[4:15].float() @ w[2].T)
    assert torch.equal(got[15:], torch.zeros(5, 24))


def test_argument_errors():
    qw = quantize_ref(torch.randn(16, 64), "nvfp4")
    x = torch.randn(4, 64).to(torch.bfloat16)
    with pytest.raises(TypeError, match="bf16 or float8_e4m3fn activations"):
        check_args(x.float(), qw)
    with pytest.raises(ValueError, match="K mismatch"):
        check_args(torch.randn(4, 32).to(torch.bfloat16), qw)
    with pytest.raises(ValueError, match="mxfp8_e5m2"):
        check_args(x, quantize_ref(torch.randn(16, 64), "mxfp8_e5m2"))
    with pytest.raises(ValueError, match="without offs"):
        check_args(x, quantize_ref(torch.randn(2, 16, 64), "nvfp4"))
    with pytest.raises(ValueError, match="experts"):
        check_args(x, quantize_ref(torch.randn(2, 16, 64), "nvfp4"), offs=torch.tensor([4], dtype=torch.int32))
    with pytest.raises(TypeError, match="int32"):
        check_args(x, quantize_ref(torch.randn(2, 16, 64), "nvfp4"), offs=torch.tensor([2, 4]))
    with pytest.raises(ValueError, match="CUDA"):
        cutegemm.gemm(x, qw)  # CPU tensors
    with pytest.raises(ValueError, match="offs is required"):
        cutegemm.grouped_gemm(x, quantize_ref(torch.randn(2, 16, 64), "nvfp4"))


def test_pick_config_tokens_per_pass():
    assert pick_config(1, "nvfp4", torch.bfloat16, "sm_90a", False).tokens_per_pass == 8
    assert pick_config(16, "nvfp4", torch.bfloat16, "sm_90a", False).tokens_per_pass == 16
    assert pick_config(32, "mxfp4", torch.bfloat16, "sm_90a", False).tokens_per_pass == 32
    assert pick_config(64, "mxfp4", torch.bfloat16, "sm_90a", False).tokens_per_pass == 64
    assert pick_config(512, "nvfp4", torch.bfloat16, "sm_90a", True, experts=32).tokens_per_pass == 16
    assert pick_config(32 * 40, "nvfp4", torch.bfloat16, "sm_90a", True, experts=32).tokens_per_pass == 64


def test_pick_config_wgmma_on_sm90_only():
    """sm_90a: the WGMMA consumers from 17 dense rows / 33 rows per expert; sm_100a never."""
    assert not pick_config(16, "nvfp4", torch.bfloat16, "sm_90a", False).wgmma
    assert pick_config(17, "nvfp4", torch.bfloat16, "sm_90a", False).wgmma
    assert not pick_config(32 * 32, "nvfp4", torch.bfloat16, "sm_90a", True, experts=32).wgmma
    assert pick_config(32 * 33, "mxfp4", torch.bfloat16, "sm_90a", True, experts=32).wgmma
    for m in (17, 64, 256):
        assert not pick_config(m, "nvfp4", torch.bfloat16, "sm_100a", False).wgmma


def test_pass_grid_policy_and_rules():
    """A CTA per (weight tile, token pass): taken for dense 256-token passes where the waves fill
    better (224 weight tiles on 132 SMs: 1024 rows, 896 CTAs in 7 waves vs 224 in 2), not where
    they fill alike (512 / 768 rows), not grouped or without the tile count; the config refuses
    it outside the dense, unsplit WGMMA consumers."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only.policy import pass_grid_pays, tail_split_pays

    assert pass_grid_pays(4, 224, 132) and not pass_grid_pays(2, 224, 132) and not pass_grid_pays(3, 224, 132)
    assert not pass_grid_pays(1, 150, 132) and pass_grid_pays(5, 150, 132)  # 750 CTAs in 6 waves vs 150 in 2 x 5
    assert not pass_grid_pays(2, 100, 132)  # 200 CTAs in 2 waves, or 100 in one of 2 passes
    assert tail_split_pays(2, 224, 132) and tail_split_pays(3, 224, 132)  # last rounds of 52, 12
    assert not tail_split_pays(1, 224, 132) and not tail_split_pays(4, 224, 132)  # 92, 104 of 132
    assert not tail_split_pays(1, 100, 132) and not tail_split_pays(2, 132, 132)  # one round; full rounds
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        mode = pick_config(1024, fmt, torch.bfloat16, "sm_90a", False, tiles_sms=(224, 132)).pass_ctas
        assert mode == (1 if fmt == "mxfp8" else 2)  # FP4: the persistent grid; MXFP8: a CTA per unit
        assert not pick_config(256, fmt, torch.bfloat16, "sm_90a", False, tiles_sms=(224, 132)).pass_ctas
        for m in (512, 768):  # the persistent grid's last round 52 / 12 of 132: the cut tail
            cfg = pick_config(m, fmt, torch.bfloat16, "sm_90a", False, tiles_sms=(224, 132))
            assert cfg.pass_ctas == 2 and cfg.tail_split and cfg.name.endswith("_pp_ts")
        assert not pick_config(1024, fmt, torch.bfloat16, "sm_90a", False, tiles_sms=(224, 132)).tail_split
        assert not pick_config(1024, fmt, torch.bfloat16, "sm_90a", False).pass_ctas
        assert not pick_config(1024 * 32, fmt, torch.bfloat16, "sm_90a", True, 32).pass_ctas
    cfg = pick_config(1024, "nvfp4", torch.bfloat16, "sm_90a", False, tiles_sms=(224, 132))
    assert cfg.name.endswith("_pp") and replace(cfg, pass_ctas=1).name.endswith("_pc")
    with pytest.raises(ValueError):
        replace(cfg, pass_ctas=3)
    with pytest.raises(ValueError):
        replace(cfg, pass_ctas=1, tail_split=True)  # the cut tail needs the persistent grid
    for bad in (dict(grouped=True), dict(split=True, staged_store=False, n_tiles=16, ring=4)):
        with pytest.raises(ValueError):
            replace(cfg, **bad)
    with pytest.raises(ValueError):
        replace(pick_config(16, "nvfp4", torch.bfloat16, "sm_90a", False), pass_ctas=True)  # mma.sync consumers


def test_wgmma_config_rules():
    base = dict(fmt="nvfp4", stages=0, ring=3, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, n_tiles=8,
                producer_pairs=False, wgmma=True)  # fmt: skip
    assert fw.Fp4WeightConfig(**base).name.endswith("_wg")
    assert fw.Fp4WeightConfig(**{**base, "n_tiles": 16, "ring": 2}).tokens_per_pass == 128
    for bad in (dict(arch="sm_100a"), dict(ring=0), dict(ring_k=4), dict(warps_n=4), dict(warps_k=2, warps_n=4),
                dict(row_tiles=2, warps_n=4), dict(split=True, grouped=True), dict(producer_pairs=True), dict(n_tiles=16, ring=3),
                dict(n_tiles=32), dict(n_tiles=32, ring=3, ring_k=2, fmt="mxfp8", producer_wg=True)):  # fmt: skip
        with pytest.raises(ValueError):
            fw.Fp4WeightConfig(**{**base, **bad})
    # 128 K per stage: FP4 ring_k 1 (64-byte weight boxes, 64-byte swizzle), MXFP8 ring_k 2
    k1 = fw.Fp4WeightConfig(**{**base, "ring_k": 1, "ring": 4, "n_tiles": 16, "producer_wg": True})
    assert (k1.stage_k, k1.w_row_bytes, k1.w_boxes, k1.scale_groups, k1.name[-4:]) == (128, 64, 1, 2, "_pwg")
    assert k1.smem_bytes == 4 * (128 * 64 + 2 * 128 * 128 + 2 * 512 + 16) + 1024 + 256
    k2 = fw.Fp4WeightConfig(**{**base, "fmt": "mxfp8", "ring_k": 2, "ring": 4, "n_tiles": 16})
    assert (k2.stage_k, k2.w_row_bytes, k2.w_boxes, k2.scale_groups) == (128, 128, 1, 1)
    assert fw.Fp4WeightConfig(**{**base, "fmt": "mxfp8", "ring_k": 4}).w_boxes == 2
    with pytest.raises(ValueError, match="producer_wg"):
        fw.Fp4WeightConfig(**{**base, "wgmma": False, "producer_wg": True, "warps_n": 4, "warps_k": 2, "row_tiles": 2})
    with pytest.raises(ValueError):  # ring_k 1: the WGMMA consumers only
        fw.Fp4WeightConfig(**{**base, "wgmma": False, "ring_k": 1, "warps_n": 4, "warps_k": 2, "row_tiles": 2})
    # 256 tokens per pass: FP4, 128-K stages, the producer warpgroup, not split; commit groups of 4 steps
    t256 = fw.Fp4WeightConfig(**{**base, "ring_k": 1, "ring": 3, "n_tiles": 32, "producer_wg": True})
    assert (t256.tokens_per_pass, t256.stage_steps, t256.group_steps) == (256, 8, 4)
    assert t256.smem_bytes == 3 * (128 * 64 + 2 * 256 * 128 + 2 * 512 + 16) + 1024 + 256 <= 227 * 1024
    assert (k1.group_steps, replace(k1, wg_steps=4).group_steps, replace(t256, wg_steps=8).group_steps) == (8, 4, 8)
    assert replace(t256, wg_steps=8).name.endswith("_pwg_g8")
    # loop trips of two commit groups at least: stages of one group two per trip, else one
    assert (k1.trip_stages, replace(k1, wg_steps=4).trip_stages, t256.trip_stages, replace(t256, wg_steps=8).trip_stages) == (
        2, 1, 1, 2)  # fmt: skip
    assert replace(t256, wg_trip=2).trip_stages == 2 and replace(t256, wg_trip=2).name.endswith("_pwg_u2")
    for bad in (dict(wg_trip=3), dict(wg_steps=8, wg_trip=1)):  # one group per trip: refused
        with pytest.raises(ValueError):
            replace(t256, **bad)
    # outputs staged through shared memory: 16 tokens x (128 outputs + 16 bytes) per round (fp32: 8)
    ss = replace(t256, staged_store=True)
    assert ss.smem_bytes - t256.smem_bytes == 16 * 272 and ss.smem_bytes <= 227 * 1024 and ss.name.endswith("_ss")
    assert replace(ss, out_dtype="fp32").smem_bytes - t256.smem_bytes == 8 * 528
    with pytest.raises(ValueError):  # not on the split grid
        replace(k1, split=True, staged_store=True)
    with pytest.raises(ValueError):  # staged_store: the WGMMA consumers only
        fw.Fp4WeightConfig(**{**base, "wgmma": False, "staged_store": True, "warps_n": 4, "warps_k": 2, "row_tiles": 2})
    with pytest.raises(ValueError):  # wg_trip: the WGMMA consumers only
        fw.Fp4WeightConfig(**{**base, "wgmma": False, "wg_trip": 1, "warps_n": 4, "warps_k": 2, "row_tiles": 2})
    for bad in (dict(split=True), dict(producer_wg=False), dict(ring_k=2, ring=2), dict(ring=4), dict(wg_steps=2)):
        with pytest.raises(ValueError):
            replace(t256, **bad)
    with pytest.raises(ValueError):  # 8-bit weights: 256 tokens per pass in 64-K stages only
        fw.Fp4WeightConfig(**{**base, "fmt": "mxfp8", "ring_k": 2, "ring": 2, "n_tiles": 32, "producer_wg": True})
    with pytest.raises(ValueError):  # wg_steps: the WGMMA consumers only
        fw.Fp4WeightConfig(**{**base, "wgmma": False, "wg_steps": 4, "warps_n": 4, "warps_k": 2, "row_tiles": 2})


def test_pick_config_streams_through_the_ring():
    for fmt in ("nvfp4", "mxfp4"):
        for grouped in (False, True):
            for m in (1, 16, 64, 4096):
                e = 32 if grouped else 1
                cfg = pick_config(m, fmt, torch.bfloat16, "sm_90a", grouped, e)
                assert cfg.ring in (3, 4) and cfg.rows_per_cta == 128 and cfg.stages == 0, cfg
                # from 65 rows (per expert): 128 or 256 tokens per pass in 128-K stages, the producer warpgroup
                wide = -(-m // e) > 64
                assert (cfg.ring_k, cfg.producer_wg, cfg.n_tiles >= 16) == ((1, True, True) if wide else (2, False, False))
                assert cfg.smem_bytes <= 227 * 1024


def test_pick_config_256_tokens_per_pass():
    """sm_90a from 129 rows: 256 tokens per pass where its passes cost less than twice as many
    128-token ones (dense; grouped: from 129 mean rows per expert), not split (MXFP8 weights in
    64-K stages); with few weight tiles 128 on the split grid."""
    def tokens(m, fmt="nvfp4", grouped=False, few=False):
        cfg = pick_config(m, fmt, torch.bfloat16, "sm_90a", grouped, 32 if grouped else 1, few_tiles=few)
        assert cfg.split == (not grouped and cfg.tokens_per_pass < 256), cfg
        staged = cfg.tokens_per_pass == 256 or (grouped and cfg.tokens_per_pass == 128)
        assert cfg.staged_store == staged and cfg.smem_bytes <= 227 * 1024, cfg
        return cfg.tokens_per_pass

    assert [tokens(m) for m in (65, 128, 129, 256, 257, 384, 385, 512, 640, 1024, 4096)] == [
        128, 128, 256, 256, 128, 128, 256, 256, 256, 256, 256]
    assert [tokens(32 * r, "mxfp4", True) for r in (128, 129, 200, 300, 512)] == [128, 256, 256, 256, 256]
    assert tokens(256, few=True) == 128 and tokens(256, "mxfp8", few=True) == 128
    assert [tokens(m, "mxfp8") for m in (128, 129, 384, 512)] == [128, 256, 128, 256]
    assert all(tokens(32 * m, "mxfp8", True) == 256 for m in (129, 384))
    assert pick_config(512, "mxfp8", torch.bfloat16, "sm_90a", False).stage_k == 64
    assert pick_config(256, "nvfp4", torch.bfloat16, "sm_100a", False).tokens_per_pass <= 32  # mma.sync there


def test_ring_config_rules():
    base = dict(fmt="nvfp4", stages=0, ring=4, ring_k=2, warps_n=4, warps_k=2, row_tiles=2)
    assert fw.Fp4WeightConfig(**base).rows_per_cta == 128
    for bad in (dict(ring_k=1), dict(ring=1), dict(ring=9), dict(warps_n=8), dict(row_tiles=4),
                dict(stages=4), dict(min_blocks=2), dict(ring=8, ring_k=4, n_tiles=8)):  # fmt: skip
        with pytest.raises(ValueError):
            fw.Fp4WeightConfig(**{**base, **bad})


def test_ring_weight_reads_are_conflict_free_and_match_the_swizzle():
    """The consumer's shared-memory address of weight row piece (row r, 16-byte piece p) equals the
    TMA 128-byte swizzle's, and every quarter-warp (8 lanes, the unit of a 16-byte-per-lane load)
    reads 8 distinct 16-byte bank groups."""

    def tma_sw128(r, byte):  # Swizzle<3,4,3> on the box's byte offset
        off = r * 128 + byte
        return off ^ (((off >> 7) & 7) << 4)

    for rb in (0, 8, 16, 40):  # first row of a 16-row MMA tile (+ 8 for its second half)
        for q in range(2):  # chunk of the 128-byte box row
            groups = {}
            for lane in range(32):
                g, t = lane // 4, lane % 4
                gp = g // 2 + 4 * (g % 2)  # kernel_ring's row map
                r, piece = rb + gp, q * 4 + t
                addr = r * 128 + (piece ^ gp) * 16  # kernel_ring's address
                assert addr == tma_sw128(r, piece * 16)
                groups.setdefault(lane // 8, set()).add((addr % 128) // 16)
            assert all(len(v) == 8 for v in groups.values()), groups
        # every weight row of the tile is read by exactly one g
        assert sorted(g // 2 + 4 * (g % 2) for g in range(8)) == list(range(8))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize(
    "cfg",
    [
        fw.Fp4WeightConfig(fmt="nvfp4", n_tiles=2),
        fw.Fp4WeightConfig(fmt="mxfp4", n_tiles=8, grouped=True),
        fw.Fp4WeightConfig(fmt="nvfp4", n_tiles=1, grouped=True, out_dtype="fp32"),
        # the streaming ring: the policy's shapes, a K-split one with fp32 out, 4-chunk stages
        pick_config(16, "nvfp4", torch.bfloat16, "sm_90a", False),
        pick_config(512, "mxfp4", torch.bfloat16, "sm_90a", True, experts=32, x_scale=True),
        fw.Fp4WeightConfig(fmt="mxfp4", n_tiles=4, out_dtype="fp32", stages=0, ring=3, ring_k=2, warps_n=4,
                           warps_k=2, row_tiles=2),  # fmt: skip
        fw.Fp4WeightConfig(fmt="nvfp4", n_tiles=1, grouped=True, stages=0, ring=2, ring_k=4, warps_n=2, warps_k=1),
    ],
    ids=lambda c: c.name,
)
def test_compile_check(cfg, arch):
    from dataclasses import replace

    ok, markers, err = fw.check_variant(replace(cfg, arch=arch))
    assert ok, (err, markers)


def test_quantized_grouped_experts_reference_on_cpu():
    from cutegemm.nn import GroupedExperts, QuantizedGroupedExperts

    torch.manual_seed(0)
    layer = GroupedExperts(3, 64, 32)
    q = QuantizedGroupedExperts.__new__(QuantizedGroupedExperts)
    torch.nn.Module.__init__(q)
    q.fmt, q.hidden = "nvfp4", 64
    q.q_gate_up = quantize_ref(layer.w_gate_up.detach().float(), "nvfp4")
    q.q_down = quantize_ref(layer.w_down.detach().float(), "nvfp4")
    x = torch.randn(9, 64).to(torch.bfloat16)
    offs = torch.tensor([2, 2, 9], dtype=torch.int32)
    got = q.forward_ref(x, offs).float()
    full = layer.forward_ref(x, offs).float()
    assert got.shape == (9, 64)
    assert (got - full).norm() <= 0.25 * full.norm()


# --- the custom op cutegemm::gemm_fp4_weight ----------------------------------------------------
def _op_args(x, qw, offs=None):
    return (x, qw.data, qw.scales, qw.global_scale, offs)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("grouped", [False, True])
def test_op_cpu_kernel_fake_and_opcheck(fmt, grouped):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cutegemm import quant_ops

    torch.manual_seed(0)
    qw = quantize_ref(torch.randn(*((3,) if grouped else ()), 40, 96), fmt)
    x = torch.randn(11, 96).to(torch.bfloat16)
    offs = torch.tensor([4, 4, 9], dtype=torch.int32) if grouped else None
    got = quant_ops.gemm_fp4_weight(x, qw, offs=offs, out_dtype=torch.float32, alpha=0.5)
    want = gemm_fp4_weight_ref(x, qw, offs=offs, out_dtype=torch.float32, alpha=0.5)
    assert torch.equal(got, want)
    with FakeTensorMode() as mode:
        fake = torch.ops.cutegemm.gemm_fp4_weight(
            *[None if t is None else mode.from_tensor(t) for t in _op_args(x, qw, offs)], fmt=fmt
        )
    assert (tuple(fake.shape), fake.dtype) == ((11, 40), torch.bfloat16)
    for test in ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"):
        torch.library.opcheck(
            torch.ops.cutegemm.gemm_fp4_weight.default, _op_args(x, qw, offs), {"fmt": fmt}, test_utils=test
        )


def test_op_bad_inputs():
    qw = quantize_ref(torch.randn(40, 96), "nvfp4")
    x = torch.randn(11, 96).to(torch.bfloat16)
    op = torch.ops.cutegemm.gemm_fp4_weight
    with pytest.raises(ValueError, match="fmt must be"):
        op(*_op_args(x, qw), fmt="mxfp8_e5m2")
    with pytest.raises(TypeError, match="w: expected mxfp8 data"):  # FP4 elements called MXFP8
        op(*_op_args(x, qw), fmt="mxfp8")
    with pytest.raises(TypeError, match="w: expected"):
        op(x, qw.data.view(torch.uint8), qw.scales, fmt="nvfp4")
    with pytest.raises(ValueError, match="w_scales"):
        op(x, qw.data, qw.scales[:, :1], fmt="nvfp4")
    with pytest.raises(ValueError, match="w_global_scale"):
        op(x, qw.data, qw.scales, torch.ones(2), fmt="nvfp4")
    with pytest.raises(ValueError, match="K mismatch"):
        op(x[:, :64], *_op_args(x, qw)[1:], fmt="nvfp4")
    with pytest.raises(ValueError, match="out_dtype"):
        op(*_op_args(x, qw), fmt="nvfp4", out_dtype=torch.int8)


def _fp4_block(x, w, offs):
    from cutegemm import quant_ops

    qw = quant_ops.quantize(w, "nvfp4")
    return quant_ops.gemm_fp4_weight(x, qw, offs=offs, out_dtype=torch.float32).relu()


def test_op_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    x = torch.randn(10, 64).to(torch.bfloat16)
    w = torch.randn(2, 24, 64)
    offs = torch.tensor([3, 10], dtype=torch.int32)
    compiled = torch.compile(_fp4_block, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x, w, offs), _fp4_block(x, w, offs))


# --- FP8 (e4m3) activations --------------------------------------------------------------------
def test_fragment_order_x_converts_e4m3_exactly():
    torch.manual_seed(0)
    k = 96  # a tail: padded with zeros to 128
    x8 = (torch.randn(3, k) * 50).to(torch.float8_e4m3fn)
    xf = fm.fragment_order_x(x8)
    assert xf.dtype == torch.bfloat16 and xf.shape == (4, 3, 4, 8)
    want = fm.fragment_order_x(x8.float().to(torch.bfloat16))  # e4m3 -> bf16 is exact
    assert torch.equal(xf, want)
    assert torch.equal(x8.float().to(torch.bfloat16).float(), x8.float())


def test_fp8_activation_reference_and_rules():
    torch.manual_seed(1)
    qw = quantize_ref(torch.randn(24, 64), "mxfp4")
    x8 = torch.randn(5, 64).to(torch.float8_e4m3fn)
    sa = torch.rand(5) + 0.5
    got = cutegemm.gemm_ref(x8, qw, scale_a=sa, out_dtype=torch.float32)
    want = (x8.float() * sa[:, None]) @ dequantize_ref(qw).T
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(  # one element: per tensor
        gemm_fp4_weight_ref(x8, qw, scale_a=sa[:1], out_dtype=torch.float32), (x8.float() * sa[0]) @ dequantize_ref(qw).T
    )
    with pytest.raises(ValueError, match="float8_e4m3fn activations"):
        check_args(x8.to(torch.bfloat16), qw, scale_a=sa)
    with pytest.raises(ValueError, match="1 or M=5"):
        check_args(x8, qw, scale_a=torch.ones(4))
    with pytest.raises(TypeError, match="float32"):
        check_args(x8, qw, scale_a=sa.double())
    from cutegemm import quant_ops

    op = quant_ops.gemm_fp4_weight(x8, qw, scale_a=sa, out_dtype=torch.float32)
    torch.testing.assert_close(op, want)


def test_multiply_placement_equals_shift_placement():
    """The kernel places each pair of nibbles with one integer multiply by a constant between two
    masks (``fp4_math._dequant_ptx``): the same bf16 bit patterns as the shift-and-mask
    placement that ``dequant_words_ref`` (checked against dequantize_ref) uses, for every byte
    value in every byte position and 200k random words."""
    from cutegemm.blockscaled.weight_only.math import placed_words_multiply_ref, placed_words_shift_ref

    b = torch.arange(256, dtype=torch.int64)
    words = [b << (8 * p) for p in range(4)]
    words.append(torch.randint(0, 2**32, (200_000,), dtype=torch.int64, generator=torch.Generator().manual_seed(0)))
    w = torch.cat(words)
    assert torch.equal(placed_words_multiply_ref(w), placed_words_shift_ref(w))


def test_dequantize_first_thresholds_per_arch():
    """sm_90a's WGMMA consumers keep up to more rows than the mma.sync consumers of sm_100a; MXFP4
    takes NVFP4's thresholds; every threshold sits above the rows the WGMMA policy was timed at."""
    from cutegemm.blockscaled.weight_only import launch as api

    for grouped in (False, True):
        assert api.dq_min_rows("nvfp4", grouped) == api.dq_min_rows("mxfp4", grouped)
        for fmt in ("nvfp4", "mxfp8"):
            hopper, other = api.dq_min_rows(fmt, grouped, "sm_90a"), api.dq_min_rows(fmt, grouped, "sm_100a")
            assert other < hopper and hopper > 512 and other >= 257, (fmt, grouped, hopper, other)


def test_wgmma_register_a_hazard_check():
    """compile-check's back-edge check of the WGMMA consumers: a loop trip of one commit group
    (its A registers rewritten at the head while the group is in flight) fails; two groups in
    different registers, or a wait for all at the trip's end, pass."""
    from cutegemm.runtime.sass import wgmma_register_a_hazards

    def sass(body):
        return "\n".join(f"        /*{0x100 + 0x10 * i:04x}*/  {x} ;" for i, x in enumerate(body + ["@P0 BRA 0x100"]))

    def group(r):
        return [f"LDS.128 R{r}, [R2]", f"HGMMA.64x256x16.F32.BF16 R24, R{r}, gdesc[UR8], R24, gsb0",
                "WARPGROUP.DEPBAR.LE gsb0, 0x1"]  # fmt: skip

    assert wgmma_register_a_hazards(sass(group(160)))  # one group per trip
    assert not wgmma_register_a_hazards(sass(group(160) + group(164)))
    # the head rewrites R165 before the wait that retires the group reading R164..R167
    assert wgmma_register_a_hazards(sass(["IADD3 R165, R1, 1, RZ"] + group(160) + group(164)))[0].startswith("0x100")
    assert not wgmma_register_a_hazards(sass(group(160) + ["WARPGROUP.DEPBAR.LE gsb0, 0x0"]))
