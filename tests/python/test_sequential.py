"""moekit.torch.ops: Sequential(GroupedLinear, ScaledSwiGLU, GroupedLinear) fused into moekit's
grouped MLP, op_kwargs buffers keyed by op or position, misrouting errors, gradients (input,
weights, bias, probs) against torch autograd in fp64."""
import pytest
import torch

from moekit.torch import ops
from conftest import DEVICES, assert_close, built_for
from reference import fp64_leaf, grouped_linear, grouped_mlp

SPLITS = [7, 0, 12, 4]  # a zero-row group; S = 23
T = 27                  # 4 tail rows
H, F = 32, 64           # fc1: H -> 2F, fc2: F -> H


def mlp(device, dtype=torch.float32, fc2_bias=False, interleave=None, **kw):
    built_for(device)
    G = len(SPLITS)
    fc1 = ops.GroupedLinear(G, H, 2 * F, bias=False, device=device, dtype=dtype, **kw)
    act = ops.ScaledSwiGLU(glu_interleave_size=interleave)
    fc2 = ops.GroupedLinear(G, F, H, bias=fc2_bias, scale_bias=fc2_bias, device=device,
                            dtype=dtype, **kw)
    if fc2_bias:
        with torch.no_grad():
            fc2.bias.normal_()
    return ops.Sequential(fc1, act, fc2), fc1, act, fc2


def extras(fc2_bias, probs):
    return (SPLITS, probs, SPLITS) + ((probs,) if fc2_bias else ())


def inputs(device, dtype=torch.float32):
    x = torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
    probs = torch.rand(T, device=device, requires_grad=True)
    return x, probs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fc2_bias", [False, True])
@pytest.mark.parametrize("interleave", [None, 32])
def test_fused_mlp_matches_fp64_torch(device, dtype, fc2_bias, interleave):
    seq, fc1, act, fc2 = mlp(device, dtype, fc2_bias, interleave)
    assert seq.plan() == "GroupedMLP(0-2)"
    x, probs = inputs(device, dtype)
    y = seq(x, *extras(fc2_bias, probs))
    dy = torch.randn_like(y)
    y.backward(dy)
    xr, pr, w1, w2 = (fp64_leaf(t) for t in (x, probs, fc1.weight, fc2.weight))
    b2 = fp64_leaf(fc2.bias) if fc2_bias else None
    yr = grouped_mlp(xr, w1, w2, pr, SPLITS, b2, interleaved=interleave == 32)
    yr.backward(dy.double())
    S = sum(SPLITS)
    assert_close(y[:S], yr[:S], dtype, scale=2)
    assert_close(x.grad, xr.grad, dtype, scale=2)
    assert_close(probs.grad, pr.grad, dtype, scale=4)
    assert torch.all(x.grad[S:] == 0) and torch.all(probs.grad[S:] == 0)
    assert_close(fc1.weight.grad, w1.grad, dtype, scale=8)
    assert_close(fc2.weight.grad, w2.grad, dtype, scale=8)
    assert torch.all(fc1.weight.grad[1] == 0)
    if fc2_bias:
        assert_close(fc2.bias.grad, b2.grad, dtype, scale=4)


@pytest.mark.parametrize("device", ["cpu"])
def test_fused_equals_unfused_bit_for_bit_on_the_cpu(device):
    seq, fc1, act, fc2 = mlp(device, fc2_bias=True)
    x, probs = inputs(device)
    results = []
    for fuse in (True, False):
        seq.set_fusion(fuse)
        for t in (x, probs, fc1.weight, fc2.weight, fc2.bias):
            t.grad = None
        y = seq(x, *extras(True, probs))
        y.backward(torch.ones_like(y))
        results.append([y.detach().clone()] + [t.grad.clone() for t in
                                               (x, probs, fc1.weight, fc2.weight, fc2.bias)])
    assert seq.plan() == "GroupedLinear(0), ScaledSwiGLU(1), GroupedLinear(2)"
    for a, b in zip(*results):
        assert torch.equal(a[:23], b[:23])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("keyed", ["module", "index"])
@pytest.mark.parametrize("which", ["output", "grad_input", "both"])
def test_op_kwargs_buffers_alias_bit_exact_keep_tail(device, keyed, which):
    seq, fc1, act, fc2 = mlp(device)
    x, probs = inputs(device)
    dy = torch.randn(T, H, device=device)
    y_ref = seq(x, *extras(False, probs))
    y_ref.backward(dy)
    dx_ref, dp_ref = x.grad.clone(), probs.grad.clone()
    x.grad = probs.grad = None
    out = torch.full((T, H), 7.0, device=device)
    gin = torch.full((T, H), 7.0, device=device)
    k_fc1, k_fc2 = (fc1, fc2) if keyed == "module" else (0, 2)
    kwargs = {}
    if which in ("output", "both"):
        kwargs[k_fc2] = {"output": out}
    if which in ("grad_input", "both"):
        kwargs[k_fc1] = {"grad_input": gin}
    y = seq(x, *extras(False, probs), op_kwargs=kwargs)
    S = sum(SPLITS)
    if which != "grad_input":
        assert y is out and y.data_ptr() == out.data_ptr()
        assert torch.all(out[S:] == 7.0)
    assert torch.equal(y[:S], y_ref[:S])
    y.backward(dy)
    if which != "output":
        assert torch.all(gin[S:] == 7.0)
        assert torch.equal(gin[:S], dx_ref[:S])
    assert torch.equal(x.grad[:S], dx_ref[:S])
    assert torch.equal(probs.grad[:S], dp_ref[:S])


def test_two_grouped_linears_with_caller_buffers_as_te():
    # TE's test_grouped_linear_caller_buffers: Sequential(GroupedLinear(3, 128->256),
    # GroupedLinear(3, 256->64)), splits [128, 256, 128]; distinct widths make a misroute fail.
    fc1 = ops.GroupedLinear(3, 128, 256, bias=True, device="cpu")
    fc2 = ops.GroupedLinear(3, 256, 64, bias=True, device="cpu")
    seq = ops.Sequential(fc1, fc2)
    splits = [128, 256, 128]
    x = torch.randn(512, 128, requires_grad=True)
    y_ref = seq(x, splits, splits)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    dx_ref = x.grad.clone()
    x.grad = None
    out, gin = torch.empty(512, 64), torch.empty(512, 128)
    y = seq(x, splits, splits, op_kwargs={seq[0]: {"grad_input": gin}, seq[1]: {"output": out}})
    assert y is out and torch.equal(y, y_ref)
    y.backward(dy)
    assert torch.equal(gin, dx_ref) and torch.equal(x.grad, dx_ref)
    with pytest.raises(ValueError, match="output"):
        seq(x, splits, splits, op_kwargs={seq[0]: {"output": torch.empty(512, 64)}})


def expect_error(seq, x, probs, op_kwargs, match):
    with pytest.raises(ValueError, match=match):
        seq(x, *extras(False, probs), op_kwargs=op_kwargs)


def test_misrouted_op_kwargs_are_moekit_errors():
    seq, fc1, act, fc2 = mlp("cpu")
    x, probs = inputs("cpu")
    buf = lambda *s: torch.empty(*s)  # noqa: E731
    expect_error(seq, x, probs, {fc1: {"output": buf(T, 2 * F)}}, r"'output' only on fc2")
    expect_error(seq, x, probs, {0: {"output": buf(T, 2 * F)}}, r"op_args\[0\]\.output")
    expect_error(seq, x, probs, {fc2: {"grad_input": buf(T, F)}}, r"'grad_input' only on fc1")
    expect_error(seq, x, probs, {act: {"output": buf(T, F)}}, "ScaledSwiGLU")
    other = ops.GroupedLinear(4, H, 2 * F, bias=False, device="cpu")
    expect_error(seq, x, probs, {other: {"output": buf(T, 2 * F)}}, "handle of an op of this")
    expect_error(seq, x, probs, {3: {"output": buf(T, H)}}, r"position in \[0, 3\)")
    expect_error(seq, x, probs, {2: {"output": buf(T, H)}, fc2: {"output": buf(T, H)}},
                 "once")
    expect_error(seq, x, probs, {2: {"out": buf(T, H)}}, "unknown argument 'out'")
    expect_error(seq, x, probs, {2: {"output": torch.empty(T, H, requires_grad=True)}},
                 "must not require gradient")
    expect_error(seq, x, probs, {2: {"output": buf(T, H + 1)}}, r"op_args\[2\]\.output")
    expect_error(seq, x, probs, {2: {"output": buf(T, H).to(torch.float16)}}, "f16")
    expect_error(seq, x, probs, {2: {"output": buf(H, T).t()}}, "contiguous")
    # unfused, inner buffers are accepted: fc1's output receives h
    seq.set_fusion(False)
    h = torch.full((T, 2 * F), 7.0)
    seq(x, *extras(False, probs), op_kwargs={fc1: {"output": h}})
    assert torch.all(h[23:] == 7.0) and not torch.all(h[:23] == 7.0)


def test_extra_inputs_are_checked():
    seq, *_ = mlp("cpu")
    x, probs = inputs("cpu")
    with pytest.raises(ValueError, match="Expected 3 extra inputs but got 2"):
        seq(x, SPLITS, probs)
    with pytest.raises(ValueError, match="one splits per call"):
        seq(x, SPLITS, probs, [7, 0, 12, 3])
    two_acts = ops.Sequential(ops.ScaledSwiGLU(), ops.ScaledSwiGLU())
    with pytest.raises(ValueError, match="one probs per call"):
        two_acts(torch.randn(T, 4 * F), probs, torch.rand(T))


@pytest.mark.parametrize("device", DEVICES)
def test_main_grad_accumulation_in_sequential(device):
    seq, fc1, act, fc2 = mlp(device, accumulate_into_main_grad=True)
    for fc in (fc1, fc2):
        fc.weight.main_grad = torch.full_like(fc.weight, 0.25)
    x, probs = inputs(device)
    dy = torch.randn(T, H, device=device)
    seq(x, *extras(False, probs)).backward(dy)
    xr, pr, w1, w2 = (fp64_leaf(t) for t in (x, probs, fc1.weight, fc2.weight))
    grouped_mlp(xr, w1, w2, pr, SPLITS).backward(dy.double())
    assert fc1.weight.grad is None and fc2.weight.grad is None
    assert_close(fc1.weight.main_grad, 0.25 + w1.grad, torch.float32, scale=8)
    assert_close(fc2.weight.main_grad, 0.25 + w2.grad, torch.float32, scale=8)


@pytest.mark.parametrize("device", DEVICES)
def test_an_op_alone_takes_its_buffers(device):
    built_for(device)
    fc = ops.GroupedLinear(4, H, F, bias=True, device=device)
    x = torch.randn(T, H, device=device, requires_grad=True)
    out = torch.full((T, F), 7.0, device=device)
    y = fc(x, SPLITS, output=out)
    assert y is out and torch.all(out[23:] == 7.0)
    ref = grouped_linear(x.double(), fc.weight.double(), fc.bias.double(), SPLITS)
    assert_close(y[:23], ref[:23], torch.float32)
    act = ops.SwiGLU()
    h = torch.randn(T, 2 * F, device=device, requires_grad=True)
    z = act(h)
    hr = fp64_leaf(h)
    zr = torch.nn.functional.silu(hr[:, :F]) * hr[:, F:]
    assert_close(z, zr, torch.float32)
    z.backward(torch.ones_like(z))
    zr.backward(torch.ones_like(zr))
    assert_close(h.grad, hr.grad, torch.float32)


def test_probs_in_bf16_get_a_bf16_gradient():
    seq, fc1, act, fc2 = mlp("cpu")
    x, _ = inputs("cpu")
    probs = torch.rand(T, dtype=torch.bfloat16, requires_grad=True)
    seq(x, SPLITS, probs, SPLITS).sum().backward()
    assert probs.grad.dtype == torch.bfloat16 and torch.all(probs.grad[23:] == 0)


def test_inference_runs_without_a_tape():
    seq, *_ = mlp("cpu")
    x, probs = inputs("cpu")
    with torch.no_grad():
        y = seq(x, *extras(False, probs))
    assert not y.requires_grad and y.shape == (T, H)
    with torch.no_grad(), pytest.raises(ValueError, match="grad_input"):
        seq(x, *extras(False, probs), op_kwargs={0: {"grad_input": torch.empty(T, H)}})


def test_delay_wgrad_compute_hands_weight_grads_over_in_backward_dw():
    def make(delay):
        torch.manual_seed(7)
        return ops.Sequential(ops.GroupedLinear(2, 16, 32, bias=True, device="cpu"),
                              ops.ScaledSwiGLU(), ops.GroupedLinear(2, 16, 8, bias=False,
                                                                    device="cpu"),
                              delay_wgrad_compute=delay)
    ref, seq = make(False), make(True)
    x = torch.randn(12, 16, requires_grad=True)
    probs = torch.rand(12)
    ref(x, [5, 7], probs, [5, 7]).sum().backward()
    dx_ref = x.grad.clone()
    x.grad = None
    seq(x, [5, 7], probs, [5, 7]).sum().backward()
    torch.testing.assert_close(x.grad, dx_ref, rtol=0, atol=0)
    assert seq[0].weight.grad is None and seq[2].weight.grad is None
    torch.testing.assert_close(seq[0].bias.grad, ref[0].bias.grad, rtol=0, atol=0)  # db now
    seq.backward_dw()
    for a, b in ((seq[0].weight, ref[0].weight), (seq[2].weight, ref[2].weight)):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
