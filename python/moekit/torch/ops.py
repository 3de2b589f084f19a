"""moekit.torch.ops: TE's fusible ops (te.pytorch.ops) on moekit — GroupedLinear, ScaledSwiGLU,
SwiGLU and Sequential, whose fc1 → ScaledSwiGLU → fc2 runs as moekit's fused grouped MLP.

    fc1 = GroupedLinear(E, H, 2 * F, bias=False)
    act = ScaledSwiGLU()
    fc2 = GroupedLinear(E, F, H, bias=False)
    mlp = Sequential(fc1, act, fc2)                     # mlp.plan() == "GroupedMLP(0-2)"
    y = mlp(x, splits, probs, splits, op_kwargs={fc2: {"output": y_buf}, 0: {"grad_input": dx_buf}})

Extra inputs follow TE's order: each GroupedLinear takes its split sizes (and, with scale_bias
and bias, the per-row scales), each ScaledSwiGLU the probs. moekit runs one splits and one probs
per call: every GroupedLinear must get the same splits and every prob-taking op the same probs.
op_kwargs keys are an op of this Sequential or its position; values {"output": buf} (receives
the op's output, returned aliased) or {"grad_input": buf} (receives the op's input gradient in
backward). Misrouted arguments are moekit's errors (ValueError, the C++ message): a key not in
this Sequential, a position out of range, `output` on an activation, `output` on fc1 or
`grad_input` on fc2 of a fused MLP.
"""
from __future__ import annotations

import math

import torch

from .. import _moekit
from . import _compile
from ._common import (bind_weight, context_for, default_device, dl, dtype_name, from_moekit,
                      recipe_for, splits_for, zero_tail)

_BUFFER_KEYS = ("output", "grad_input")


class FusibleOperation(torch.nn.Module):
    """A basic op: runs alone (`op(x, *extra_inputs, output=..., grad_input=...)`) or in a
    Sequential. Holds one moekit op per (device, stream)."""

    num_extra_inputs = 0

    def __init__(self):
        super().__init__()
        self._cpp: dict = {}

    def _device(self) -> torch.device | None:
        return None  # ops without parameters run where their input is

    def _make_cpp(self, ctx, dtype: torch.dtype, recipe):
        raise NotImplementedError

    def _cpp_op(self, key, ctx, dtype: torch.dtype, recipe=None):
        """key: (context key, recipe key); recipe: the moekit.Recipe of the recipe key."""
        op = self._cpp.get((key, dtype))
        if op is None:
            op = self._make_cpp(ctx, dtype, recipe)
            self._cpp[(key, dtype)] = op
        return op

    def _bind_params(self, op):  # sets the moekit op's parameters to this module's tensors
        pass

    def _params(self) -> list:
        return []

    def forward(self, x, *extra_inputs, **kwargs):
        alone = self.__dict__.get("_alone")  # not a submodule: it holds this op
        if alone is None:
            alone = Sequential(self)
            self.__dict__["_alone"] = alone
        return alone(x, *extra_inputs, op_kwargs={0: kwargs} if kwargs else None)


class GroupedLinear(FusibleOperation):
    """TE's te.ops.GroupedLinear: weight [G, N, K], bias [G, N] (one packed tensor each).
    scale_bias (with bias): y = x·W_gᵀ + p_t·b_g with per-row scales p (an extra input).
    accumulate_into_main_grad: backward adds dW into weight.main_grad (fp32 [G, N, K])."""

    def __init__(self, num_groups: int, in_features: int, out_features: int, *, bias: bool = True,
                 device=None, dtype: torch.dtype | None = None,
                 accumulate_into_main_grad: bool = False, scale_bias: bool = False):
        super().__init__()
        if num_groups <= 0 or in_features <= 0 or out_features <= 0:
            raise ValueError(f"moekit: GroupedLinear needs positive sizes, got num_groups="
                             f"{num_groups}, in_features={in_features}, out_features={out_features}")
        dtype = dtype if dtype is not None else torch.get_default_dtype()
        dtype_name(dtype)
        device = default_device(device)
        self.num_groups, self.in_features, self.out_features = num_groups, in_features, out_features
        self.use_bias, self.scale_bias = bias, scale_bias and bias
        self.accumulate_into_main_grad = accumulate_into_main_grad
        self.num_extra_inputs = 2 if self.scale_bias else 1
        self.weight = torch.nn.Parameter(
            torch.empty(num_groups, out_features, in_features, dtype=dtype, device=device))
        for g in range(num_groups):
            torch.nn.init.kaiming_uniform_(self.weight.data[g], a=math.sqrt(5))
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(num_groups, out_features, dtype=dtype,
                                                       device=device))
        else:
            self.register_parameter("bias", None)

    def _device(self):
        return self.weight.device

    def _make_cpp(self, ctx, dtype, recipe):
        # the active autocast recipe (per moekit op, SPEC §6d: one op per recipe, each with its
        # own weight cache); fc1 and fc2 under one recipe fuse into the quantized grouped MLP
        return _moekit.GroupedLinearOp(ctx, self.num_groups, self.in_features, self.out_features,
                                       dtype_name(self.weight.dtype), self.use_bias, self.scale_bias,
                                       recipe=recipe)

    def notify_weight_changed(self):
        """After writing the weight where torch's version counter does not see it (`weight.data`,
        outside torch): the next forward quantizes it again. Optimizer steps need no call."""
        for op in self._cpp.values():
            op.notify_weight_changed()

    def _bind_params(self, op):
        bound = self.__dict__.setdefault("_bound", {})
        params = self._parameters  # the dict itself: Module.__getattr__ costs ~0.7 µs a read
        weight, bias = params["weight"], params["bias"]
        bind_weight(bound, op, weight)
        main_grad = self._main_grad()
        requires = main_grad is not None or weight.requires_grad or (
            bias is not None and bias.requires_grad)
        # What the moekit op holds besides the weight (bias, main_grad and whether it computes
        # weight gradients) is set again only when it changed: each tensor by object and address
        # (ints, so the comparison never calls a tensor's __eq__; the tensors themselves are kept
        # in `bound`, so neither an id nor an address can be another tensor's while recorded).
        state = (_identity(bias), _identity(main_grad), requires)
        if bound.get(("state", id(op))) != state:
            if bias is not None:
                op.set_bias(dl(bias))
            op.weight_requires_grad = requires
            op.set_main_grad(dl(main_grad))
            bound[("state", id(op))] = state
            bound[("alive", id(op))] = (bias, main_grad)

    def _main_grad(self):
        if not (self.accumulate_into_main_grad and self.weight.requires_grad):
            return None
        main_grad = getattr(self.weight, "main_grad", None)
        if main_grad is None:
            raise ValueError("moekit: accumulate_into_main_grad needs weight.main_grad "
                             "(an fp32 [G, N, K] tensor the caller sets)")
        return main_grad

    def _params(self):
        params = self._parameters
        bias = params["bias"]
        return [params["weight"]] if bias is None else [params["weight"], bias]

    def extra_repr(self):
        return (f"num_groups={self.num_groups}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.use_bias}, "
                f"scale_bias={self.scale_bias}")


def _identity(t):
    """(object id, address) of a tensor, or None: what a binding is recorded by."""
    return None if t is None else (id(t), t.data_ptr())


def _layout(glu_interleave_size):
    if glu_interleave_size is None:
        return "halves"
    if glu_interleave_size == 32:
        return "interleaved32"
    raise ValueError(f"moekit: glu_interleave_size must be None (halves) or 32, got "
                     f"{glu_interleave_size}")


class ScaledSwiGLU(FusibleOperation):
    """z = p_t · silu(a) ⊙ b of h = [a | b] (or 32-column interleaved blocks); takes the probs."""

    num_extra_inputs = 1

    def __init__(self, glu_interleave_size: int | None = None):
        super().__init__()
        self.layout = _layout(glu_interleave_size)

    def _make_cpp(self, ctx, dtype, recipe):
        return _moekit.ScaledSwiGLU(ctx, self.layout)


class SwiGLU(FusibleOperation):
    """z = silu(a) ⊙ b of h = [a | b] (or 32-column interleaved blocks)."""

    def __init__(self, glu_interleave_size: int | None = None):
        super().__init__()
        self.layout = _layout(glu_interleave_size)

    def _make_cpp(self, ctx, dtype, recipe):
        return _moekit.SwiGLU(ctx, self.layout)


def _same_splits(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and
                          a.dtype == b.dtype and a.device == b.device)
    return [int(v) for v in a] == [int(v) for v in b]


class _SequentialFunction(torch.autograd.Function):
    """The autograd node of a moekit Sequential call. Its forward takes moekit's forward already
    enqueued (y, tape: the caller launched it just before apply, so the GPU starts without
    waiting for autograd's bookkeeping) and returns y, the output buffer when one was given."""

    @staticmethod
    def forward(ctx, x, probs, out, seq_cpp, y, tape, keep, params_meta, *params):
        if out is not None:
            ctx.mark_dirty(out)
            y = out
        else:
            y = from_moekit(y)
        ctx.seq_cpp, ctx.tape, ctx.keep, ctx.params_meta = seq_cpp, tape, keep, params_meta
        ctx.params = params
        return y

    @staticmethod
    def backward(ctx, dy):
        grad_input0, splits, module = ctx.keep
        defer = module.delay_wgrad_compute
        dy = dy.contiguous()
        dx, dprobs, grads, pending = ctx.seq_cpp.backward(ctx.tape, dl(dy),
                                                          defer_weight_grads=defer)
        deferred = []
        if not ctx.needs_input_grad[0]:
            dx = None
        elif grad_input0 is not None:
            dx = grad_input0  # the caller's buffer on op 0, written in place: its tail untouched
        else:
            dx = zero_tail(from_moekit(dx), splits)
        out = [dx,
               zero_tail(from_moekit(dprobs), splits) if ctx.needs_input_grad[1] else None]
        out += [None] * 6
        # params_meta: per GroupedLinear, (position, has bias, weight into main_grad)
        i = 8
        for position, has_bias, main_grad in ctx.params_meta:
            dw, db = grads[position]
            if defer and not main_grad and ctx.needs_input_grad[i]:
                deferred.append((ctx.params[i - 8], dw))  # assigned by backward_dw()
                out.append(None)
            else:
                out.append(None if main_grad or not ctx.needs_input_grad[i] else from_moekit(dw))
            i += 1
            if has_bias:
                out.append(from_moekit(db) if ctx.needs_input_grad[i] else None)
                i += 1
        if defer:  # dy and the tape's inputs stay allocated until the deferred work is waited for
            module._wgrad_store.append((pending, deferred, (dy, ctx.tape)))
        return tuple(out)


class Sequential(torch.nn.Module):
    """TE's te.ops.Sequential over moekit ops: forward(x, *extra_inputs, op_kwargs=None)."""

    def __init__(self, *ops: FusibleOperation, fuse: bool = True,
                 delay_wgrad_compute: bool = False):
        super().__init__()
        # TE's delay_wgrad_compute: backward leaves the weight gradients running (on the GPU on
        # moekit's side stream, SPEC §1b) and backward_dw() hands them over
        self.delay_wgrad_compute = delay_wgrad_compute
        self._wgrad_store: list = []
        for i, op in enumerate(ops):
            if not isinstance(op, FusibleOperation):
                raise ValueError(f"moekit: Sequential takes moekit.torch.ops operations; op {i} is "
                                 f"{type(op).__name__}")
        self._ops = torch.nn.ModuleList(ops)
        # (position, op) of the ops with parameters, fixed at construction: what each call binds
        self._linears = [(i, op) for i, op in enumerate(ops) if isinstance(op, GroupedLinear)]
        # fixed at construction too: each extra input's (position, kind) in TE's order — a
        # GroupedLinear's splits (and with scale_bias its per-row scales), a ScaledSwiGLU's probs —
        # and each op's position by identity (op_kwargs keyed by module)
        self._extra_slots = []
        for i, op in enumerate(ops):
            if isinstance(op, GroupedLinear):
                self._extra_slots.append((i, "splits"))
                if op.scale_bias:
                    self._extra_slots.append((i, "probs"))
            elif isinstance(op, ScaledSwiGLU):
                self._extra_slots.append((i, "probs"))
        self._positions = {id(op): i for i, op in enumerate(ops)}
        self._fuse = fuse
        self._cpp: dict = {}
        _compile.register(self)  # the name the compiled path's custom ops know it by

    def __len__(self):
        return len(self._ops)

    def __getitem__(self, i):
        return self._ops[i]

    def __iter__(self):
        return iter(self._ops)

    def backward_dw(self):
        """With delay_wgrad_compute: the weight gradients of every backward since the last call
        (torch's current stream waits for them, no host sync), assigned to weight.grad (summed)
        or left in weight.main_grad (accumulate_into_main_grad)."""
        while self._wgrad_store:
            pending, deferred, _inputs = self._wgrad_store.pop(0)
            pending.wait()
            for weight, dw in deferred:
                if dw is not None:
                    g = from_moekit(dw)
                    weight.grad = g if weight.grad is None else weight.grad + g

    def set_fusion(self, enabled: bool):
        self._fuse = enabled
        for seq in self._cpp.values():
            seq.set_fusion(enabled)

    def _seq(self, key, ctx, dtype, recipe=None):
        seq = self._cpp.get((key, dtype))
        if seq is None:
            seq = _moekit.Sequential([op._cpp_op(key, ctx, dtype, recipe) for op in self._ops],
                                     self._fuse)
            self._cpp[(key, dtype)] = seq
        return seq

    def plan(self, device=None, dtype=None) -> str:
        """How the ops run, e.g. "GroupedMLP(0-2)" (moekit's Sequential::plan)."""
        device = device or next((op._device() for op in self._ops if op._device() is not None),
                                torch.device("cpu"))
        dtype = dtype or next((p.dtype for op in self._ops for p in op._params()),
                              torch.get_default_dtype())
        key, ctx = context_for(device)
        recipe_key, recipe = recipe_for(device)
        return self._seq((key, recipe_key), ctx, dtype, recipe).plan()

    def _route_extra_inputs(self, extra_inputs):
        slots = self._extra_slots
        if len(extra_inputs) != len(slots):
            raise ValueError(f"moekit: Expected {len(slots)} extra inputs but got {len(extra_inputs)}")
        splits = probs = None
        splits_op = probs_op = None
        for (i, kind), v in zip(slots, extra_inputs):
            if kind == "splits":
                if splits_op is not None and not _same_splits(splits, v):
                    raise ValueError(f"moekit: Sequential runs one splits per call: got different "
                                     f"split sizes for op {splits_op} and op {i}")
                splits, splits_op = v, i
            else:
                if probs_op is not None and v is not probs and not (
                        isinstance(v, torch.Tensor) and v.data_ptr() == probs.data_ptr() and
                        v.shape == probs.shape and v.dtype == probs.dtype):
                    raise ValueError(f"moekit: Sequential runs one probs per call: got different "
                                     f"probs for op {probs_op} and op {i}")
                probs, probs_op = v, i
        return splits, probs

    def _route_op_kwargs(self, op_kwargs, key, ctx, dtype, x_rows):
        """[(position or moekit op, output, grad_input)] for moekit, which checks the routing
        (keys, placements, shapes) and names the key as given."""
        routed, last_output, first_grad_input = [], None, None
        n = len(self._ops)
        for k, kw in (op_kwargs or {}).items():
            if isinstance(k, bool) or not isinstance(k, (int, FusibleOperation)):
                raise ValueError(f"moekit: op_kwargs keys are ops of this Sequential or positions, "
                                 f"got {type(k).__name__}")
            if not isinstance(kw, dict):
                raise ValueError(f"moekit: op_kwargs[{k!r}] must be a dict, got {type(kw).__name__}")
            unknown = [name for name in kw if name not in _BUFFER_KEYS]
            if unknown:
                raise ValueError(f"moekit: op_kwargs[{k!r}]: unknown argument {unknown[0]!r} "
                                 f"(expected 'output' or 'grad_input')")
            for name in _BUFFER_KEYS:
                buf = kw.get(name)
                if buf is None:
                    continue
                if not isinstance(buf, torch.Tensor) or buf.requires_grad:
                    label = (f"op_kwargs[{k!r}]" if isinstance(k, int)
                             else f"op_kwargs[{type(k).__name__}]")
                    if not isinstance(buf, torch.Tensor):
                        raise TypeError(f"moekit: {label}[{name!r}] must be a torch.Tensor")
                    raise ValueError(f"moekit: {label}[{name!r}] buffer must not require gradient "
                                     "(reusing an earlier output as a buffer? pass buffer.detach())")
            cpp_key = k if isinstance(k, int) else k._cpp_op(key, ctx, dtype)
            routed.append((cpp_key, dl(kw.get("output")), dl(kw.get("grad_input"))))
            position = k if isinstance(k, int) else self._positions.get(id(k))
            if position is not None and position < 0:
                position += n
            if position == n - 1 and kw.get("output") is not None:
                last_output = kw["output"]
            if position == 0 and kw.get("grad_input") is not None:
                first_grad_input = kw["grad_input"]
        return routed, last_output, first_grad_input

    def _out_features(self, width: int) -> int:
        for op in self._ops:
            width = op.out_features if isinstance(op, GroupedLinear) else width // 2
        return width

    def _prepare(self, x2: torch.Tensor, splits_in):
        """(moekit Sequential of the device, dtype and active recipe with its ops' parameters
        bound, splits for moekit, splits kept for zero_tail) — the compiled path's first step."""
        params = [p for op in self._ops for p in op._params()]
        device = next((op._device() for op in self._ops if op._device() is not None), x2.device)
        dtype = params[0].dtype if params else x2.dtype
        key, ctx = context_for(device)
        recipe_key, recipe = recipe_for(device)
        key = (key, recipe_key)
        groups = next((op.num_groups for op in self._ops if isinstance(op, GroupedLinear)), 1)
        splits, keep = splits_for(splits_in, device, groups)
        seq = self._seq(key, ctx, dtype, recipe)
        for op in self._ops:
            op._bind_params(op._cpp_op(key, ctx, dtype))
        return seq, splits, keep

    def _compiled_forward(self, x, splits_in, probs):
        params = [p for op in self._ops for p in op._params()]
        dtype = params[0].dtype if params else x.dtype
        width = x.shape[-1]
        x2 = x.reshape(-1, width).to(dtype).contiguous()
        if splits_in is None:
            splits_in = [x2.shape[0]]
        if isinstance(splits_in, torch.Tensor):
            splits, splits_tensor = [], splits_in
        else:
            splits, splits_tensor = [int(v) for v in splits_in], None
        if probs is not None:
            probs = probs.reshape(-1).float().contiguous()
        save = torch.is_grad_enabled() and (
            x2.requires_grad or (probs is not None and probs.requires_grad) or
            any(p.requires_grad for p in params))
        y, _ = _compile.sequential(x2, probs, splits, splits_tensor, _compile.register(self),
                                   self._out_features(width), save, params)
        return y.view(*x.shape[:-1], y.shape[-1]) if x.dim() != 2 else y

    def forward(self, x: torch.Tensor, *extra_inputs, op_kwargs: dict | None = None):
        if not torch.compiler.is_compiling():  # eager: straight to the call (no compile wrapper)
            return self._run_eager(x, *extra_inputs, op_kwargs=op_kwargs)
        traceable = not op_kwargs and not self.delay_wgrad_compute and all(
            not isinstance(op, GroupedLinear) or (
                not op.accumulate_into_main_grad and op.weight.requires_grad and
                (op.bias is None or op.bias.requires_grad)) for op in self._ops)
        if traceable:
            # traced: moekit's call as a torch.library custom op (no graph break, _compile.py)
            splits_in, probs = self._route_extra_inputs(extra_inputs)
            return self._compiled_forward(x, splits_in, probs)
        return self._forward_eager(x, *extra_inputs, op_kwargs=op_kwargs)

    def _run_eager(self, x: torch.Tensor, *extra_inputs, op_kwargs: dict | None = None):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"moekit: input must be a torch.Tensor, got {type(x).__name__}")
        splits_in, probs = self._route_extra_inputs(extra_inputs)
        linears = self._linears
        params = [p for _, op in linears for p in op._params()]
        device = linears[0][1].weight.device if linears else x.device
        dtype = params[0].dtype if params else x.dtype
        width = x.shape[-1]
        # [T, H] as given when it is one: a reshape of a tensor that requires grad is an autograd
        # view node (µs of host time before moekit's first kernel)
        x2 = x if x.dim() == 2 else x.reshape(-1, width)
        if x2.dtype != dtype:
            x2 = x2.to(dtype)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        key, ctx = context_for(device)
        recipe_key, recipe = recipe_for(device)  # the active autocast recipe, read at forward
        key = (key, recipe_key)
        groups = linears[0][1].num_groups if linears else 1
        if splits_in is None:
            splits_in = [x2.shape[0]]  # ops without groups take S = T
        splits, splits_keep = splits_for(splits_in, device, groups)
        if probs is not None:
            if probs.dim() != 1:
                probs = probs.reshape(-1)
            if probs.dtype != torch.float32:
                probs = probs.float()  # moekit's probs are fp32; autograd casts the gradient back
            if not probs.is_contiguous():
                probs = probs.contiguous()
        seq = self._seq(key, ctx, dtype, recipe)
        for _, op in linears:  # the other ops have no parameters to bind
            op._bind_params(op._cpp_op(key, ctx, dtype))
        routed, out, grad_input0 = self._route_op_kwargs(op_kwargs, key, ctx, dtype, x2.shape[0])
        needs_grad = torch.is_grad_enabled() and (
            x2.requires_grad or (probs is not None and probs.requires_grad) or
            any(p.requires_grad for p in params))
        if needs_grad:
            # moekit's forward first (its kernels queue now), then autograd's node around it
            y, tape = seq.forward(dl(x2), splits, probs=dl(probs), op_args=routed,
                                  input_requires_grad=x2.requires_grad,
                                  probs_requires_grad=probs is not None and probs.requires_grad,
                                  save=True)
            meta = [(i, op.bias is not None, op._main_grad() is not None) for i, op in linears]
            y = _SequentialFunction.apply(x2, probs, out, seq, y, tape,
                                          (grad_input0, splits_keep, self), meta, *params)
        else:
            y, _ = seq.forward(dl(x2), splits, probs=dl(probs), op_args=routed,
                               input_requires_grad=False, probs_requires_grad=False, save=False)
            y = out if out is not None else from_moekit(y)
        if x.dim() != 2:
            y = y.view(*x.shape[:-1], y.shape[-1])
        return y

    # op_kwargs buffers, main_grad, frozen parameters under torch.compile: one graph break
    # (SPEC §8: a buffer written in backward is a mutation AOTAutograd cannot take in 2.11)
    _forward_eager = torch.compiler.disable(_run_eager)
