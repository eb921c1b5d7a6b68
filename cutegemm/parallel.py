"""Expert-parallel MoE layer on ``torch.distributed`` (NCCL on GPUs, gloo on the CPU).

Each rank of ``ep_group`` owns a contiguous block of ``num_experts_total // world_size`` experts,
stored as a :class:`cutegemm.nn.GroupedExperts`. A forward pass routes every (token, top-k slot)
pair to the rank that owns its expert, runs the local experts there with the packed grouped GEMM,
sends the results back and combines them with the router weights. Capacity-free: no token is
dropped, any number of tokens may go to any expert (including none).

Exchange protocol of :meth:`ExpertParallelMoE.forward` (W ranks, L local experts per rank,
T tokens on this rank, k slots per token):

1. Flatten the T*k (token, slot) pairs and sort them by global expert id
   (:func:`cutegemm.moe.dispatch`: stable, on the device). Since experts are assigned to ranks in contiguous blocks, the sorted pairs are already
   grouped by destination rank, and within each destination by local expert.
2. Count pairs per global expert (the differences of the dispatch's offs, on the device) ->
   ``send_counts`` (W, L).
3. ``all_to_all_single`` of the counts (equal splits of L int64 each) -> ``recv_counts`` (W, L):
   ``recv_counts[r, l]`` = pairs rank r sends to this rank's local expert l.
4. **The one host read**: the per-rank split sizes (``send_counts.sum(1)`` and
   ``recv_counts.sum(1)``) are copied to the host in one transfer, because ``all_to_all_single``
   takes uneven splits only as Python lists. Everything else stays on the device.
5. ``all_to_all_single`` of the token rows (uneven splits; differentiable, see below) -> received
   rows, ordered by source rank and, within a source, by local expert. The local expert id of
   every received row is implied by ``recv_counts`` (it is rebuilt on the device with
   ``repeat_interleave``), so it is not sent: that saves one collective and its bandwidth.
6. Re-sort the received rows by local expert (stable argsort), build ``offs`` (int32 cumulative end
   row per local expert, ``recv_counts.sum(0).cumsum(0)``) on the device, run the local experts
   (``GroupedExperts.forward`` = :func:`cutegemm.moe.grouped_experts`: the cutegemm grouped GEMMs
   on CUDA tensors, the reference twins on CPU tensors, so gloo tests run without a GPU).
7. Un-sort, send the result rows back with the reverse ``all_to_all_single`` (splits swapped),
   and combine (:func:`cutegemm.moe.combine`, fp32 sums): ``out[t] = sum_j topk_weight[t, j] * y[t, j]``.

Training: the layer is differentiable in x, topk_weight and the local expert weights. Both row
exchanges (steps 5 and 7) go through :class:`AllToAll`, an autograd function whose backward is the
reverse exchange (splits swapped; the same as ``torch.distributed.nn.functional.all_to_all_single``,
which torch 2.13 deprecates with a warning per call); the counts exchange (step 3) carries no
gradient. The token gather is :func:`cutegemm.moe.gather_tokens` (its backward sums each token's
rows in slot order), the permutations :func:`cutegemm.moe.permute_rows` (gathers both ways), the
local experts run :func:`cutegemm.moe.grouped_experts`' backward (grouped GEMMs), the combine
:func:`cutegemm.moe.combine`'s.
The backward runs the two exchanges in reverse order, so every rank of the group must call
``backward`` (also with T == 0) and pass x with the same ``requires_grad`` (a rank whose x needs
no gradient would skip the reverse token exchange that the others wait in).

Limitations: expert ids are not range-checked unless ``check_routing=True`` (a host sync);
no fp8/MXFP8 dispatch yet; not CUDA-graph capturable (step 4 is a host read).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .api.face import grouped_gemm_ref
from .moe import combine, dispatch, gather_tokens, inverse_permutation, permute_rows
from .nn import GroupedExperts


def _check_routing_shapes(x, topk_idx, topk_weight, hidden):
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"x must be (tokens, hidden={hidden}), got {tuple(x.shape)}")
    if topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"topk_idx must be (tokens={x.shape[0]}, k), got {tuple(topk_idx.shape)}")
    if topk_weight.shape != topk_idx.shape:
        raise ValueError(f"topk_weight {tuple(topk_weight.shape)} must match topk_idx {tuple(topk_idx.shape)}")
    if topk_idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"topk_idx must be int64 (or int32), got {topk_idx.dtype}")
    if topk_idx.device != x.device or topk_weight.device != x.device:
        raise ValueError("x, topk_idx and topk_weight must be on one device")


def _expert_counts(offs: torch.Tensor) -> torch.Tensor:
    """Rows per expert (int64) from the cumulative end rows ``offs`` of :func:`cutegemm.moe.dispatch`."""
    return torch.diff(offs, prepend=offs.new_zeros(1)).long()


class AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` of rows with uneven splits, differentiable: the backward sends the
    gradient rows back with the splits swapped (itself differentiable)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=out_splits,
                               input_split_sizes=in_splits, group=group)  # fmt: skip
        return out

    @staticmethod
    def backward(ctx, grad):
        return AllToAll.apply(grad.contiguous(), ctx.in_splits, ctx.out_splits, ctx.group), None, None, None


class ExpertParallelMoE(nn.Module):
    """Expert-parallel MoE expert layer (see the module docstring for the exchange protocol).

    Args:
        num_experts_total: experts across all ranks; must be divisible by the group's world size.
        hidden, intermediate: expert MLP sizes (``down(silu(x @ W_gate) * (x @ W_up))``).
        ep_group: a ``torch.distributed`` ProcessGroup (None: the default world group).
        dtype, device: of the local expert weights (and of the tokens passed to ``forward``).

    Rank r of ``ep_group`` owns global experts ``[r * L, (r + 1) * L)`` with
    ``L = num_experts_total // world_size``, stored in ``self.experts`` (a ``GroupedExperts``).
    """

    def __init__(self, num_experts_total: int, hidden: int, intermediate: int, ep_group=None,
                 dtype=torch.bfloat16, device=None):  # fmt: skip
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ExpertParallelMoE needs an initialized torch.distributed process group")
        self.ep_group = ep_group
        self.world_size = dist.get_world_size(ep_group)
        self.rank = dist.get_rank(ep_group)
        if num_experts_total <= 0 or num_experts_total % self.world_size:
            raise ValueError(
                f"num_experts_total={num_experts_total} must be a positive multiple of the expert-parallel "
                f"world size {self.world_size} (each rank owns the same number of experts)"
            )
        self.num_experts_total = num_experts_total
        self.num_local_experts = num_experts_total // self.world_size
        self.expert_start = self.rank * self.num_local_experts
        self.hidden, self.intermediate = hidden, intermediate
        self.experts = GroupedExperts(self.num_local_experts, hidden, intermediate, dtype=dtype, device=device)

    def extra_repr(self) -> str:
        return (f"experts {self.expert_start}..{self.expert_start + self.num_local_experts - 1} of "
                f"{self.num_experts_total}, rank {self.rank}/{self.world_size}")  # fmt: skip

    @torch.no_grad()
    def load_full_weights(self, w_gate_up: torch.Tensor, w_down: torch.Tensor):
        """Copy this rank's slice out of the full expert weights (E_total, 2I, hidden) and
        (E_total, hidden, I), e.g. built on every rank from a common seed."""
        s, e = self.expert_start, self.expert_start + self.num_local_experts
        self.experts.w_gate_up.copy_(w_gate_up[s:e])
        self.experts.w_down.copy_(w_down[s:e])

    @torch.no_grad()
    def gather_full_weights(self):
        """All ranks' expert weights, concatenated in global expert order (a collective: every rank
        of the group must call it). Returns (w_gate_up (E_total, 2I, hidden), w_down (E_total, hidden, I))."""
        full = []
        for w in (self.experts.w_gate_up, self.experts.w_down):
            parts = [torch.empty_like(w) for _ in range(self.world_size)]
            dist.all_gather(parts, w.detach().contiguous(), group=self.ep_group)
            full.append(torch.cat(parts))
        return tuple(full)

    def reference_forward(self, x, topk_idx, topk_weight, all_weights=None):
        """Single-process result for this rank's tokens from the full set of expert weights
        (``all_weights`` = (w_gate_up, w_down); gathered from all ranks when None, which is a
        collective). fp32 math, plain torch (``grouped_gemm_ref``)."""
        if all_weights is None:
            all_weights = self.gather_full_weights()
        return moe_reference(x, topk_idx, topk_weight, *all_weights)

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor,
                check_routing: bool = False) -> torch.Tensor:  # fmt: skip
        """x (T, hidden) this rank's tokens; topk_idx (T, k) global expert ids; topk_weight (T, k).
        Returns (T, hidden) in x's dtype. Every rank of the group must call it (collectives), also
        with T == 0."""
        _check_routing_shapes(x, topk_idx, topk_weight, self.hidden)
        if check_routing and topk_idx.numel():
            lo, hi = int(topk_idx.min()), int(topk_idx.max())  # host sync, opt-in
            if lo < 0 or hi >= self.num_experts_total:
                raise ValueError(f"expert ids must lie in [0, {self.num_experts_total}), got [{lo}, {hi}]")
        W, L, group = self.world_size, self.num_local_experts, self.ep_group
        dev = x.device

        # 1-2. sort pairs by expert; per-expert counts (== per (destination rank, local expert)).
        k = topk_idx.shape[1]
        routing = dispatch(topk_idx, self.num_experts_total)
        send_counts = _expert_counts(routing.offs)
        # (T*k, H), by destination rank, then local expert
        x_send = gather_tokens(x, routing.order, k, routing.rows, routing.inverse)

        # 3. exchange the counts (equal splits: L per rank).
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        recv_counts = recv_counts.view(W, L)

        # 4. the one host read: split sizes as Python lists (all_to_all_single needs them so).
        splits = torch.stack([send_counts.view(W, L).sum(1), recv_counts.sum(1)]).tolist()
        send_splits, recv_splits = splits
        total_recv = sum(recv_splits)

        # 5. exchange the token rows (uneven splits; differentiable).
        x_recv = AllToAll.apply(x_send, recv_splits, send_splits, group)

        # 6. re-sort by local expert, offs on the device, local experts.
        local_id = torch.repeat_interleave(
            torch.arange(L, device=dev).repeat(W), recv_counts.reshape(-1), output_size=total_recv
        )
        perm = torch.argsort(local_id, stable=True)
        offs = recv_counts.sum(0).cumsum(0).to(torch.int32)
        inverse = inverse_permutation(perm)
        y_local = self.experts(permute_rows(x_recv, perm, inverse), offs)
        y_recv = permute_rows(y_local, inverse, perm)

        # 7. send the results back (splits swapped) and combine with the router weights.
        y_back = AllToAll.apply(y_recv, send_splits, recv_splits, group)
        return combine(y_back, routing.order, k, topk_weight, out_dtype=x.dtype, inverse=routing.inverse)


def moe_reference(x, topk_idx, topk_weight, w_gate_up, w_down):
    """Single-process reference: all experts in one process, fp32 math (``grouped_gemm_ref``).
    w_gate_up (E, 2I, hidden) (rows interleaved: 2j gate j, 2j + 1 up j, as GroupedExperts),
    w_down (E, hidden, I)."""
    routing = dispatch(topk_idx, w_gate_up.shape[0])
    xs = x.index_select(0, routing.rows)
    h = grouped_gemm_ref(xs, w_gate_up.transpose(1, 2), offs=routing.offs, out_dtype=torch.float32)
    act = torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2]
    y = grouped_gemm_ref(act, w_down.transpose(1, 2), offs=routing.offs, out_dtype=torch.float32)
    return combine(y, routing.order, topk_weight.shape[1], topk_weight, out_dtype=x.dtype, inverse=routing.inverse)


def moe_single_device(x, topk_idx, topk_weight, experts: GroupedExperts):
    """The same layer on one device with every expert local (no communication): the 1-GPU baseline
    for the benchmark and the multi-GPU tests. CUDA: cutegemm grouped GEMM; CPU: the reference
    twins. Differentiable in x, topk_weight and the expert weights."""
    _check_routing_shapes(x, topk_idx, topk_weight, experts.hidden)
    k = topk_idx.shape[1]
    routing = dispatch(topk_idx, experts.num_experts)
    y = experts(gather_tokens(x, routing.order, k, routing.rows, routing.inverse), routing.offs)
    return combine(y, routing.order, k, topk_weight, out_dtype=x.dtype, inverse=routing.inverse)
