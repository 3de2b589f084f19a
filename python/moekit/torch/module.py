"""moekit.torch.GroupedLinear: TE's GroupedLinear module on moekit (forward(inp, m_splits, out=,
dgrad_out=)), with Megatron's weight.main_grad accumulation."""
from __future__ import annotations

import math

import torch

from .. import _moekit
from . import _compile
from ._common import (bind_weight, check_buffer, context_for, default_device, dl, dtype_name,
                      from_moekit, recipe_for, splits_for, zero_tail)


def _init_grouped_weight(weight: torch.Tensor):
    # As torch.nn.Linear per expert: kaiming-uniform, a = sqrt(5).
    for g in range(weight.shape[0]):
        torch.nn.init.kaiming_uniform_(weight[g], a=math.sqrt(5))


class _GroupedLinearFunction(torch.autograd.Function):
    """y = grouped x·Wᵀ + b through moekit; `out` is written in place and returned (mark_dirty),
    `dgrad_out` receives dx in backward and is returned as the input's gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, out, module, layer, y, saved, keep_splits, dgrad_out,
                main_grad):
        # y, saved: moekit's forward, enqueued by the caller just before apply (the GPU starts
        # without waiting for autograd's bookkeeping)
        input_grad = ctx.needs_input_grad[0]
        if out is not None:
            ctx.mark_dirty(out)
            y = out
        else:
            y = from_moekit(y)
        ctx.module, ctx.layer, ctx.saved, ctx.weight, ctx.bias = module, layer, saved, weight, bias
        ctx.keep = (x, keep_splits)
        ctx.dgrad_out = dgrad_out if input_grad else None
        ctx.main_grad = main_grad
        return y

    @staticmethod
    def backward(ctx, dy):
        layer = ctx.layer
        bind_weight(ctx.module._bound, layer, ctx.weight)
        wgrad = ctx.needs_input_grad[1] or ctx.main_grad is not None
        layer.weight_requires_grad = wgrad or (ctx.bias is not None and ctx.needs_input_grad[2])
        layer.set_main_grad(dl(ctx.main_grad))
        defer = ctx.module.delay_wgrad_compute and wgrad
        dy = dy.contiguous()
        dx, dw, db, pending = layer.backward(ctx.saved, dl(dy),
                                             grad_input=dl(ctx.dgrad_out),
                                             defer_weight_grads=defer)
        layer.set_main_grad(None)  # the call bound it (and a deferred one holds it)
        if ctx.dgrad_out is not None:
            dx = ctx.dgrad_out
        else:
            dx = zero_tail(from_moekit(dx), ctx.keep[1])
        if defer:  # backward_dw() waits for it and assigns weight.grad (or main_grad holds it)
            # dy and x stay allocated (torch's allocator must not hand their memory out) until
            # the deferred work that reads them has been waited for
            ctx.module._wgrad_store.append((pending, dw, ctx.main_grad is not None, ctx.weight,
                                            (dy, ctx.keep)))
            dw = None
        elif ctx.main_grad is not None:
            dw = None  # accumulated into weight.main_grad
            if hasattr(ctx.weight, "grad_added_to_main_grad"):
                ctx.weight.grad_added_to_main_grad = True
        else:
            dw = from_moekit(dw) if ctx.needs_input_grad[1] else None
        db = from_moekit(db) if ctx.bias is not None and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None, None, None, None, None


class GroupedLinear(torch.nn.Module):
    """G expert Linear layers over rows grouped by expert (TE's te.pytorch.GroupedLinear).

    Parameters: `weight` [G, N, K] (expert g's (out, in) matrix, like torch.nn.Linear.weight) and
    `bias` [G, N] — one packed tensor each (TE's single_grouped_weight / single_grouped_bias).
    `forward(inp, m_splits, out=None, dgrad_out=None)`: inp [..., K] with rows grouped by expert,
    m_splits the rows per expert (a list, or an integer tensor [G]: on the GPU, device counts need
    no host sync and are CUDA-graph safe). `out` [T, N] receives y and is returned; `dgrad_out`
    [T, K] receives dx in backward (T = rows of inp, a tail past sum(m_splits) is left untouched).
    fuse_wgrad_accumulation: backward adds dW into `weight.main_grad` (fp32 [G, N, K], set by the
    caller) and leaves weight.grad None. delay_wgrad_compute: backward returns dx and db with
    the weight gradients still running (beside dx's consumer, on the GPU), and backward_dw()
    hands them over (TE's delay_wgrad_compute / backward_dw). device: as TE, "cuda" by default (the CPU where torch
    sees no GPU). The arguments after out_features are keyword-only (TE's positional order has
    sequence_parallel and more, which moekit does not take).
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *, bias: bool = True,
                 params_dtype: torch.dtype | None = None, device=None,
                 fuse_wgrad_accumulation: bool = False, delay_wgrad_compute: bool = False):
        super().__init__()
        if num_gemms <= 0 or in_features <= 0 or out_features <= 0:
            raise ValueError(f"moekit: GroupedLinear needs positive sizes, got num_gemms={num_gemms}, "
                             f"in_features={in_features}, out_features={out_features}")
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias = bias
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = delay_wgrad_compute
        self._wgrad_store: list = []  # deferred weight gradients until backward_dw()
        dtype = params_dtype if params_dtype is not None else torch.get_default_dtype()
        dtype_name(dtype)
        device = default_device(device)
        self.weight = torch.nn.Parameter(
            torch.empty(num_gemms, out_features, in_features, dtype=dtype, device=device))
        _init_grouped_weight(self.weight.data)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(num_gemms, out_features, dtype=dtype,
                                                       device=device))
        else:
            self.register_parameter("bias", None)
        self._layers: dict = {}  # moekit GroupedLinear per (device, stream, dtype, recipe)
        self._bound: dict = {}  # per layer: the weight it views and torch's version of it
        _compile.register(self)  # the name the compiled path's custom ops know it by

    def _layer(self):
        key, ctx = context_for(self.weight.device)
        recipe_key, recipe = recipe_for(self.weight.device)
        # a module moved to another device or dtype, or run under another recipe, gets another
        # layer (moekit's recipe is per layer, SPEC §6d), each with its own weight cache
        key = (key, self.weight.dtype, recipe_key)
        layer = self._layers.get(key)
        if layer is None:
            layer = _moekit.GroupedLinear(ctx, self.num_gemms, self.in_features, self.out_features,
                                          dtype_name(self.weight.dtype), self.use_bias,
                                          recipe=recipe)
            self._layers[key] = layer
        return layer

    def notify_weight_changed(self):
        """After writing the weight in a way torch's version counter does not see (through
        `weight.data`, or from outside torch): the next forward quantizes it again (recipes).
        In-place writes through the parameter itself (optimizer steps) need no call."""
        for layer in self._layers.values():
            layer.notify_weight_changed()

    def forward(self, inp: torch.Tensor, m_splits, out: torch.Tensor | None = None,
                dgrad_out: torch.Tensor | None = None) -> torch.Tensor:
        if not torch.compiler.is_compiling():  # eager: straight to the call (no compile wrapper)
            return self._run_eager(inp, m_splits, out, dgrad_out)
        training = torch.is_grad_enabled() and (inp.requires_grad or self.weight.requires_grad or (
            self.bias is not None and self.bias.requires_grad))
        if torch.compiler.is_compiling() and dgrad_out is None and not (
                self.delay_wgrad_compute or self.fuse_wgrad_accumulation) and not (
                    training and out is not None):
            # traced: moekit's call as a torch.library custom op (no graph break, _compile.py)
            x = inp.reshape(-1, self.in_features).to(self.weight.dtype).contiguous()
            if out is not None:
                check_buffer("out", out, (x.shape[0], self.out_features), self.weight.dtype,
                             self.weight.device)
            y = _compile.module_forward(self, x, m_splits, out)
            return y.view(*inp.shape[:-1], self.out_features) if inp.dim() != 2 else y
        return self._forward_eager(inp, m_splits, out, dgrad_out)

    def _run_eager(self, inp, m_splits, out, dgrad_out):
        if not isinstance(inp, torch.Tensor):
            raise TypeError(f"moekit: inp must be a torch.Tensor, got {type(inp).__name__}")
        if inp.size(-1) != self.in_features:
            raise ValueError(f"moekit: input's last dimension {inp.size(-1)} does not match "
                             f"in_features {self.in_features}")
        dtype, device = self.weight.dtype, self.weight.device
        x = inp.reshape(-1, self.in_features)
        if x.dtype != dtype:
            x = x.to(dtype)
        x = x.contiguous()
        rows = x.shape[0]
        if out is not None:
            check_buffer("out", out, (rows, self.out_features), dtype, device)
        if dgrad_out is not None:
            check_buffer("dgrad_out", dgrad_out, (rows, self.in_features), dtype, device)
        splits, keep = splits_for(m_splits, device, self.num_gemms)
        main_grad = None
        if self.fuse_wgrad_accumulation and self.weight.requires_grad:
            main_grad = getattr(self.weight, "main_grad", None)
            if main_grad is None:
                raise ValueError("moekit: fuse_wgrad_accumulation needs weight.main_grad "
                                 "(an fp32 [G, N, K] tensor the caller sets)")
        layer = self._layer()
        bind_weight(self._bound, layer, self.weight)
        if self.bias is not None:
            layer.set_bias(dl(self.bias))
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad or
                                        (self.bias is not None and self.bias.requires_grad)):
            # moekit's forward first (its kernels queue now), then autograd's node around it
            y, saved = layer.forward(dl(x), splits, output=dl(out),
                                     input_requires_grad=x.requires_grad, save=True)
            y = _GroupedLinearFunction.apply(x, self.weight, self.bias, out, self, layer, y, saved,
                                             keep, dgrad_out, main_grad)
        else:
            y, _ = layer.forward(dl(x), splits, output=dl(out), input_requires_grad=False,
                                 save=False)
            y = out if out is not None else from_moekit(y)
        if inp.dim() != 2:
            y = y.view(*inp.shape[:-1], self.out_features)
        return y

    # dgrad_out, main_grad and delayed wgrad under torch.compile: one graph break (SPEC §8)
    _forward_eager = torch.compiler.disable(_run_eager)

    def backward_dw(self):
        """With delay_wgrad_compute: the weight gradients of every backward since the last call.
        moekit queued them on a side stream after dx (SPEC §1b: they overlap whatever the caller
        runs on dx next); this makes torch's current stream wait for them (no host sync) and
        assigns weight.grad (summed over the backwards), or leaves them in weight.main_grad."""
        while self._wgrad_store:
            pending, dw, into_main_grad, weight, _inputs = self._wgrad_store.pop(0)
            pending.wait()
            if into_main_grad:
                if hasattr(weight, "grad_added_to_main_grad"):
                    weight.grad_added_to_main_grad = True
            elif dw is not None:
                g = from_moekit(dw)
                weight.grad = g if weight.grad is None else weight.grad + g

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.use_bias}, dtype={self.weight.dtype}")
