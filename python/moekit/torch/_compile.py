"""torch.compile through moekit's calls: the module calls as torch.library custom ops (SPEC §8).

Under torch.compile (torch.compiler.is_compiling()) moekit.torch.GroupedLinear and ops.Sequential
call these ops instead of their eager autograd.Functions, so Dynamo traces the model without a
graph break (fullgraph=True works): each op is opaque to the compiler, with a fake (shape)
implementation and its autograd formula registered.

- `moekit::grouped_linear` (x, weight, bias?, splits, splits_tensor?, module, out?) -> (y, handle)
  and `moekit::grouped_linear_backward`; `moekit::sequential` / `moekit::sequential_backward`.
  `module` is an integer naming the moekit.torch module (a registry of weak references): its moekit
  layer, contexts and the active recipe are looked up when the op runs (the recipe is read at
  forward, as in eager mode). `handle` is an int64 [1] tensor (value 0) whose storage names what the
  forward saved for backward (moekit's Saved / Tape, which is no tensor); the entry is freed with
  the handle tensor, so a forward whose backward never runs leaks nothing.
- `moekit::grouped_linear_out` (inference with the module's `out` buffer): `out` declared in
  `mutates_args`, written in place, nothing returned (an op may not return an alias of its
  input); the module returns `out` itself, as in eager mode. torch 2.11 takes no autograd formula
  for a mutating custom op ("Cannot register autograd formula for non-functional operator"), so
  a training call with `out` stays on the eager path (a graph break).
- Kept as a graph break (the eager path under torch.compiler.disable): `out` when training (above),
  `dgrad_out` / op_kwargs
  buffers (a buffer written in backward; torch 2.11's AOTAutograd does not take mutations of
  forward inputs inside the backward graph), weight.main_grad accumulation (a parameter attribute
  mutated in backward) and delay_wgrad_compute (work left running past the backward).
"""
from __future__ import annotations

import itertools
import weakref

import torch

from ._common import bind_weight, dl, from_moekit, zero_tail

_modules: "weakref.WeakValueDictionary[int, torch.nn.Module]" = weakref.WeakValueDictionary()
_module_ids = itertools.count(1)
_saved: dict = {}


def register(module) -> int:
    mid = module.__dict__.get("_compile_id")
    if mid is None:
        mid = next(_module_ids)
        module.__dict__["_compile_id"] = mid
        _modules[mid] = module
    return mid


def _handle(obj) -> torch.Tensor:
    # keyed by the handle tensor's storage (its value is 0: the same in every run, as opcheck and
    # AOTAutograd's output comparisons expect); the entry goes with the tensor
    h = torch.zeros(1, dtype=torch.int64)
    key = h.data_ptr()
    _saved[key] = obj
    weakref.finalize(h, _saved.pop, key, None)
    return h


def _take(handle: torch.Tensor):
    obj = _saved.pop(handle.data_ptr(), None)
    if obj is None:
        raise ValueError("moekit: the forward's saved state is gone (one backward per forward: a "
                         "second backward of one graph is an error, SPEC §1a)")
    return obj


def _splits(splits: list[int], splits_tensor):
    if splits_tensor is None:
        return splits, splits
    from ._common import splits_for
    return splits_for(splits_tensor, splits_tensor.device, splits_tensor.numel())


# ---------------------------------------------------------------- GroupedLinear (the module)
def _gl_forward(x, weight, bias, splits, splits_tensor, module, save, out):
    m = _modules[module]
    layer = m._layer()
    bind_weight(m._bound, layer, weight)
    if bias is not None:
        layer.set_bias(dl(bias))
    s, keep = _splits(splits, splits_tensor)
    layer.weight_requires_grad = save
    y, saved = layer.forward(dl(x), s, output=dl(out), input_requires_grad=save, save=save)
    handle = _handle((layer, saved, x, keep)) if save else torch.zeros(1, dtype=torch.int64)
    return from_moekit(y), handle


@torch.library.custom_op("moekit::grouped_linear", mutates_args=())
def grouped_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   splits: list[int], splits_tensor: torch.Tensor | None, module: int,
                   save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _gl_forward(x, weight, bias, splits, splits_tensor, module, save, None)


@grouped_linear.register_fake
def _(x, weight, bias, splits, splits_tensor, module, save):
    return x.new_empty(x.shape[0], weight.shape[1]), torch.empty(1, dtype=torch.int64)


@torch.library.custom_op("moekit::grouped_linear_out", mutates_args=("out",))
def grouped_linear_out(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       splits: list[int], splits_tensor: torch.Tensor | None, module: int,
                       out: torch.Tensor) -> None:
    """Inference with a caller buffer: y written into `out` (torch 2.11 takes no autograd
    formula for a mutating custom op, so training with `out` is the eager path)."""
    _gl_forward(x, weight, bias, splits, splits_tensor, module, False, out)


@grouped_linear_out.register_fake
def _(x, weight, bias, splits, splits_tensor, module, out):
    return None


@torch.library.custom_op("moekit::grouped_linear_backward", mutates_args=())
def grouped_linear_backward(dy: torch.Tensor, handle: torch.Tensor, x: torch.Tensor,
                            weight: torch.Tensor, has_bias: bool, module: int
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    layer, saved, _x, keep = _take(handle)
    m = _modules[module]
    bind_weight(m._bound, layer, weight)
    dx, dw, db, _ = layer.backward(saved, dl(dy.contiguous()))
    dx = zero_tail(from_moekit(dx), keep)
    db = from_moekit(db) if has_bias else weight.new_empty(0)
    return dx, from_moekit(dw), db


@grouped_linear_backward.register_fake
def _(dy, handle, x, weight, has_bias, module):
    db = weight.new_empty(weight.shape[0], weight.shape[1]) if has_bias else weight.new_empty(0)
    return x.new_empty(x.shape), weight.new_empty(weight.shape), db


def _gl_setup(ctx, inputs, output):
    x, weight, bias, _splits_l, _splits_t, module, _save = inputs
    ctx.save_for_backward(output[1], x, weight)
    ctx.has_bias, ctx.module = bias is not None, module


def _gl_backward(ctx, dy, _dhandle):
    handle, x, weight = ctx.saved_tensors
    dx, dw, db = grouped_linear_backward(dy, handle, x, weight, ctx.has_bias, ctx.module)
    return dx, dw, (db if ctx.has_bias else None), None, None, None, None


grouped_linear.register_autograd(_gl_backward, setup_context=_gl_setup)


def module_forward(module, x, m_splits, out):
    """The compiled path of moekit.torch.GroupedLinear.forward (x already [T, K], contiguous)."""
    if isinstance(m_splits, torch.Tensor):
        splits, splits_tensor = [], m_splits
    else:
        splits, splits_tensor = [int(v) for v in m_splits], None
    save = torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad or (
        module.bias is not None and module.bias.requires_grad))
    if out is not None:
        grouped_linear_out(x, module.weight, module.bias, splits, splits_tensor,
                           register(module), out)
        return out
    y, _ = grouped_linear(x, module.weight, module.bias, splits, splits_tensor,
                          register(module), save)
    return y


# ---------------------------------------------------------------- Sequential
@torch.library.custom_op("moekit::sequential", mutates_args=())
def sequential(x: torch.Tensor, probs: torch.Tensor | None, splits: list[int],
               splits_tensor: torch.Tensor | None, module: int, out_features: int, save: bool,
               params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    seq_module = _modules[module]
    seq, s, keep = seq_module._prepare(x, splits_tensor if splits_tensor is not None else splits)
    y, tape = seq.forward(dl(x), s, probs=dl(probs), op_args=[], input_requires_grad=save,
                          probs_requires_grad=save and probs is not None, save=save)
    handle = _handle((seq, tape, x, probs, keep)) if save else torch.zeros(1, dtype=torch.int64)
    return from_moekit(y), handle


@sequential.register_fake
def _(x, probs, splits, splits_tensor, module, out_features, save, params):
    return x.new_empty(x.shape[0], out_features), torch.empty(1, dtype=torch.int64)


@torch.library.custom_op("moekit::sequential_backward", mutates_args=())
def sequential_backward(dy: torch.Tensor, handle: torch.Tensor, x: torch.Tensor,
                        probs: torch.Tensor | None, params: list[torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    seq, tape, _x, _probs, keep = _take(handle)
    dx, dprobs, grads, _ = seq.backward(tape, dl(dy.contiguous()))
    flat = []
    for dw, db in grads:
        for g in (dw, db):
            if g is not None:
                flat.append(from_moekit(g))
    dprobs = zero_tail(from_moekit(dprobs), keep) if probs is not None else x.new_empty(0)
    return zero_tail(from_moekit(dx), keep), dprobs, flat


@sequential_backward.register_fake
def _(dy, handle, x, probs, params):
    dprobs = probs.new_empty(probs.shape) if probs is not None else x.new_empty(0)
    return x.new_empty(x.shape), dprobs, [p.new_empty(p.shape) for p in params]


def _seq_setup(ctx, inputs, output):
    x, probs, _s, _st, _module, _n, _save, params = inputs
    ctx.save_for_backward(output[1], x, probs, *params)
    ctx.has_probs = probs is not None


def _seq_backward(ctx, dy, _dhandle):
    handle, x, probs, *params = ctx.saved_tensors
    dx, dprobs, grads = sequential_backward(dy, handle, x, probs, params)
    return dx, (dprobs if ctx.has_probs else None), None, None, None, None, None, list(grads)


sequential.register_autograd(_seq_backward, setup_context=_seq_setup)
