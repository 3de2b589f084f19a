"""moekit.torch.ep: expert-parallel dispatch and combine with autograd (SPEC §7), over a group the
caller runs — one rank per process (torch.distributed) or thread — with symmetric memory the
caller brings (e.g. torch.distributed._symmetric_memory: its buffer and `buffer_ptrs`).

    comm = caller_communicator(rank, world, region, peer_bases, barrier, all_gather)
    ep = ExpertParallel(comm, num_local_experts=L, hidden_size=H, topk=k, max_tokens=T,
                        receive_capacity=R, dtype=torch.bfloat16)
    recv, splits, probs, handle = ep.dispatch(x, topk_idx, topk_weights)
    y_exp = mlp(recv, splits, probs, splits,                       # moekit.torch.ops.Sequential
                op_kwargs={fc2: {"output": ep.combine_input},       # zero copy: the combine reads it
                           fc1: {"grad_input": ep.dispatch_backward_input}})
    y = ep.combine(handle, y_exp)                                  # [T, H]; y.backward(...) flows
                                                                   # to x and topk_weights
The combine sums a token's rows (the routing weights are applied in the MLP, as probs). One layer
step in flight per ExpertParallel: the next dispatch's MLP reuses the two buffers.
`barrier` must order every rank's stores before it against every rank's work after it on the
rank's stream (GPUs: a stream-ordered barrier, e.g. the symmetric memory handle's barrier);
`all_gather(bytes)` returns every rank's bytes in rank order. On a GPU the calls agree in band
(all_gather runs at construction only, so a step captures in a CUDA graph): a rank whose arguments
are refused raises ValueError, the others store nothing for that call and find the refusal with
`Context.check_device_errors()` (SPEC §7, "In-band agreement").
"""
from __future__ import annotations

import torch

from .. import _moekit
from ._common import context_for, dl, dtype_name, from_moekit


def caller_communicator(rank: int, world_size: int, region: torch.Tensor, peer_bases,
                        barrier, all_gather):
    """A rank over `region` (uint8 [bytes], this rank's block of a symmetric allocation; on the
    device the rank runs on) and every rank's base address of it (ints); runs on torch's current
    stream there."""
    if not isinstance(region, torch.Tensor) or region.dtype != torch.uint8 or region.dim() != 1:
        raise ValueError("moekit: region must be a 1-D torch.uint8 tensor")
    _, ctx = context_for(region.device)
    return _moekit.caller_communicator(rank, world_size, ctx, dl(region),
                                       [int(b) for b in peer_bases], barrier, all_gather)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_weights, ep, topk_idx, holder):
        recv, splits, _tpe, weights, _rows, handle = ep.dispatch(
            dl(x.contiguous()), dl(topk_idx.contiguous()), dl(topk_weights.contiguous()))
        ctx.ep, ctx.handle = ep, handle
        holder["handle"], holder["splits"] = handle, from_moekit(splits.counts)
        ctx.mark_non_differentiable(holder["splits"])
        return from_moekit(recv), from_moekit(weights), holder["splits"]

    @staticmethod
    def backward(ctx, grad_recv, grad_weights, _grad_splits):
        if grad_recv is None:
            grad_recv = torch.zeros_like(from_moekit(ctx.ep.dispatch_backward_input))
        gw = dl(grad_weights.contiguous()) if grad_weights is not None else None
        dx, dw = ctx.ep.dispatch_backward(ctx.handle, dl(grad_recv.contiguous()), gw)
        return from_moekit(dx), from_moekit(dw) if gw is not None else None, None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_out, ep, handle):
        ctx.ep, ctx.handle = ep, handle
        return from_moekit(ep.combine(handle, dl(expert_out.contiguous())))

    @staticmethod
    def backward(ctx, dy):
        return from_moekit(ctx.ep.combine_backward(ctx.handle, dl(dy.contiguous()))), None, None


class ExpertParallel:
    """One rank's dispatch / combine (moekit::ExpertParallel) with autograd; the ranks of the
    communicator construct theirs together (a collective) with the same arguments."""

    def __init__(self, comm, num_local_experts: int, hidden_size: int, topk: int,
                 max_tokens: int, receive_capacity: int, *, dtype: torch.dtype = torch.bfloat16,
                 alignment: int = 1, overflow: str = "error"):
        self.dtype = dtype
        self._ep = _moekit.ExpertParallel(comm, num_local_experts, hidden_size, dtype_name(dtype),
                                          topk, max_tokens, receive_capacity, alignment, overflow)

    @staticmethod
    def symmetric_bytes(num_local_experts: int, hidden_size: int, topk: int, max_tokens: int,
                        receive_capacity: int, world_size: int, *, dtype=torch.bfloat16,
                        device="cpu", alignment: int = 1) -> int:
        """Bytes of symmetric region one ExpertParallel of these arguments needs per rank."""
        return _moekit.ExpertParallel.symmetric_bytes(
            num_local_experts, hidden_size, dtype_name(dtype), topk, max_tokens, receive_capacity,
            world_size, "cpu" if torch.device(device).type == "cpu" else "cuda", alignment)

    @property
    def combine_input(self) -> torch.Tensor:
        """[R, H]: the MLP's output buffer (fc2's `output`), read in place by combine."""
        return from_moekit(self._ep.combine_input)

    @property
    def dispatch_backward_input(self) -> torch.Tensor:
        """[R, H]: the MLP's input-gradient buffer (fc1's `grad_input`), read by the backward."""
        return from_moekit(self._ep.dispatch_backward_input)

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor):
        """(recv [R, H] expert-major, splits [L] int64 device counts (the MLP's m_splits),
        probs [R] f32 (each row's routing weight), handle). recv and probs carry autograd."""
        holder = {}
        recv, probs, splits = _Dispatch.apply(x, topk_weights, self._ep, topk_idx, holder)
        return recv, splits, probs, holder["handle"]

    def combine(self, handle, expert_out: torch.Tensor) -> torch.Tensor:
        """y [T, H]: each token's rows summed (fixed order, fp32)."""
        return _Combine.apply(expert_out, self._ep, handle)
