"""torch.compile runs a model that uses moekit.torch. Under compilation the moekit calls are
torch.library custom ops (moekit::grouped_linear, moekit::sequential; python/moekit/torch/
_compile.py): fullgraph=True compiles with no graph break and matches eager mode, values and
gradients; the ops pass torch.library.opcheck. The calls kept as a graph break (dgrad_out,
op_kwargs buffers, main_grad: SPEC §8) still compile with fullgraph=False and match."""
import pytest
import torch

import moekit.torch as mt
from moekit.torch import ops
from moekit.torch.recipe import MXFP8BlockScaling


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(16, 16)
        self.fc = mt.GroupedLinear(3, 16, 16, device="cpu")
        self.mlp = ops.Sequential(ops.GroupedLinear(3, 16, 64, bias=False, device="cpu"),
                                  ops.ScaledSwiGLU(), ops.GroupedLinear(3, 32, 16, bias=False,
                                                                        device="cpu"))

    def forward(self, x, probs, out=None, dgrad_out=None):
        h = torch.relu(self.pre(x))
        h = self.fc(h, [3, 0, 5], out=out, dgrad_out=dgrad_out)
        return self.mlp(h, [3, 0, 5], probs, [3, 0, 5]) * 2


def _run(model, fn, x, probs, **kw):
    x.grad = probs.grad = None
    model.zero_grad(set_to_none=True)
    y = fn(x, probs, **kw)
    y.sum().backward()
    return [y.detach().clone(), x.grad.clone(), probs.grad.clone(), model.pre.weight.grad.clone(),
            model.fc.weight.grad.clone(), model.fc.bias.grad.clone(),
            model.mlp[0].weight.grad.clone(), model.mlp[2].weight.grad.clone()]


def _assert_same(got, ref):
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_fullgraph_compile_matches_eager(backend):
    model = Model()
    x = torch.randn(8, 16, requires_grad=True)
    probs = torch.rand(8, requires_grad=True)
    ref = _run(model, model, x, probs)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    _assert_same(_run(model, compiled, x, probs), ref)
    _assert_same(_run(model, compiled, x, probs), ref)  # the cached graph, run again


def test_fullgraph_compile_with_a_recipe_and_an_inference_out_buffer():
    fc = mt.GroupedLinear(2, 32, 32, device="cpu")

    def f(x):
        return fc(torch.tanh(x), [32, 32]) + 1

    def g(x, out):
        return fc(torch.tanh(x), [32, 32], out=out) * 2

    x = torch.randn(64, 32, requires_grad=True)
    with mt.autocast(recipe=MXFP8BlockScaling()):
        ye = f(x)
        ye.sum().backward()
        ref = [ye.detach().clone(), x.grad.clone(), fc.weight.grad.clone()]
        x.grad = None
        fc.weight.grad = fc.bias.grad = None
        torch._dynamo.reset()
        yc = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        yc.sum().backward()
        _assert_same([yc.detach(), x.grad, fc.weight.grad], ref)
        with torch.no_grad():  # inference with a caller buffer: moekit::grouped_linear_out
            out_e = torch.zeros(64, 32)
            ze = g(x, out_e)
            out_c = torch.zeros(64, 32)
            zc = torch.compile(g, backend="aot_eager", fullgraph=True)(x, out_c)
    _assert_same([zc, out_c], [ze, out_e])
    torch.testing.assert_close(out_c, ye.detach() - 1)


def test_graph_break_paths_still_compile_and_match():
    model = Model()
    x = torch.randn(8, 16, requires_grad=True)
    probs = torch.rand(8, requires_grad=True)
    ref = _run(model, model, x, probs, out=torch.zeros(8, 16), dgrad_out=torch.zeros(8, 16))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    got = _run(model, compiled, x, probs, out=torch.zeros(8, 16), dgrad_out=torch.zeros(8, 16))
    _assert_same(got, ref)


def test_opcheck_grouped_linear():
    fc = mt.GroupedLinear(3, 16, 8, device="cpu")
    from moekit.torch import _compile
    mid = _compile.register(fc)
    x = torch.randn(10, 16, requires_grad=True)
    for splits, st in (([4, 0, 6], None), ([], torch.tensor([4, 0, 6]))):
        torch.library.opcheck(torch.ops.moekit.grouped_linear.default,
                              (x, fc.weight, fc.bias, splits, st, mid, True))
    with torch.no_grad():
        torch.library.opcheck(torch.ops.moekit.grouped_linear_out.default,
                              (x, fc.weight, fc.bias, [4, 0, 6], None, mid, torch.zeros(10, 8)))


def test_opcheck_sequential():
    seq = ops.Sequential(ops.GroupedLinear(2, 16, 32, bias=False, device="cpu"),
                         ops.ScaledSwiGLU(), ops.GroupedLinear(2, 16, 8, bias=True, device="cpu"))
    from moekit.torch import _compile
    mid = _compile.register(seq)
    x = torch.randn(12, 16, requires_grad=True)
    probs = torch.rand(12, requires_grad=True)
    params = [p for op in seq for p in op._params()]
    torch.library.opcheck(torch.ops.moekit.sequential.default,
                          (x, probs, [5, 7], None, mid, 8, True, params))
