"""Quantized recipes through moekit.torch (SPEC §6, §8): TE's recipe classes and autocast, each
recipe through GroupedLinear forward / backward against an fp64 reference built from moekit's CPU
reference quantize (moekit.quantize_dequantize: what each GEMM's operands are, SPEC §6b), that
quantize itself against plain-torch quantizers (fp8-current, mxfp8), caller buffers, the weight
cache after an in-place optimizer step, and the errors of unsupported fields."""
import dataclasses

import pytest
import torch

import moekit
import moekit.torch as mt
from moekit.torch import ops
from moekit.torch.recipe import (Float8BlockScaling, Float8CurrentScaling, Format, MMParams,
                                 MXFP8BlockScaling, NVFP4BlockScaling)

F32 = torch.float32
RECIPES = {
    "fp8-current": Float8CurrentScaling,
    "fp8-current-e4m3": lambda: Float8CurrentScaling(fp8_format=Format.E4M3),
    "fp8-block": Float8BlockScaling,
    "fp8-block-fp32-scales": lambda: Float8BlockScaling(use_power_2_scales=False),
    "mxfp8": MXFP8BlockScaling,
    "nvfp4": NVFP4BlockScaling,
}
CPU = moekit.Context.cpu()
G, K, N = 3, 64, 64
SPLITS = [32, 0, 64]  # multiples of 32 (every recipe's group rule); T = 128: a 32-row tail
T = 128


def qd(x, splits, recipe, role, columnwise=False):
    """moekit's CPU reference quantize + dequantize of x [T, C] (f32 result, [T, C])."""
    x = x.detach().contiguous()
    t, c = x.shape
    out = torch.zeros((c, t) if columnwise else (t, c), dtype=F32)
    moekit.quantize_dequantize(CPU, x, splits, recipe.to_moekit(), role, columnwise, out)
    return out.t() if columnwise else out


def reference(x, w, b, dy, splits, recipe):
    """y, dx, dW, db of a quantized grouped linear (SPEC §6b's operands), in fp64."""
    g, n, k = w.shape
    w2 = w.detach().reshape(g * n, k)
    ws = [n] * g
    xq = qd(x, splits, recipe, "input").double()
    wq = qd(w2, ws, recipe, "weight").double().view(g, n, k)
    dyq = qd(dy, splits, recipe, "grad_output").double()
    wqc = qd(w2, ws, recipe, "weight", columnwise=True).double().view(g, n, k)
    dyqc = qd(dy, splits, recipe, "grad_output", columnwise=True).double()
    xqc = qd(x, splits, recipe, "input", columnwise=True).double()
    y = torch.zeros(x.shape[0], n, dtype=torch.float64)
    dx = torch.zeros(x.shape[0], k, dtype=torch.float64)
    dw = torch.zeros(g, n, k, dtype=torch.float64)
    db = torch.zeros(g, n, dtype=torch.float64)
    a = 0
    for e, m in enumerate(splits):
        y[a:a + m] = xq[a:a + m] @ wq[e].T + (b[e].double() if b is not None else 0)
        dx[a:a + m] = dyq[a:a + m] @ wqc[e]
        dw[e] = dyqc[a:a + m].T @ xqc[a:a + m]
        db[e] = dy[a:a + m].double().sum(0)
        a += m
    return y, dx, dw, db


def close(a, b, rtol=1e-4, atol=1e-4):
    torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", list(RECIPES))
def test_grouped_linear_per_recipe_matches_quantized_reference(name):
    recipe = RECIPES[name]()
    layer = mt.GroupedLinear(G, K, N, bias=True, params_dtype=F32, device="cpu")
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(T, K, dtype=F32, requires_grad=True)
    dy = torch.randn(T, N, dtype=F32)
    with mt.autocast(recipe=recipe):
        y = layer(x, SPLITS)
    y.backward(dy)  # outside the context: backward uses the forward's recipe
    S = sum(SPLITS)
    y_ref, dx_ref, dw_ref, db_ref = reference(x, layer.weight, layer.bias, dy, SPLITS, recipe)
    close(y[:S], y_ref[:S])
    close(x.grad, dx_ref)  # rows [S, T) of dx: zero
    close(layer.weight.grad, dw_ref)
    close(layer.bias.grad, db_ref)
    # quantized: differs from the unquantized layer (the recipe really ran)
    y_plain = layer(x, SPLITS)
    assert not torch.equal(y[:S], y_plain[:S])


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "mxfp8"), (torch.float16, "fp8-block"),
                                        (torch.float16, "fp8-current")])
def test_16_bit_layers_with_a_recipe(dtype, name):
    """A bf16 or fp16 layer under a recipe (fp16: the dtype the FP8 GEMMs also write on a GPU):
    forward and backward against the fp64 reference of the quantized operands, within one
    16-bit rounding of the outputs."""
    recipe = RECIPES[name]()
    layer = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dtype, device="cpu")
    x = torch.randn(T, K, dtype=dtype, requires_grad=True)
    dy = torch.randn(T, N, dtype=dtype)
    with mt.fp8_autocast(enabled=True, fp8_recipe=recipe):  # TE's older name
        y = layer(x, SPLITS)
    y.backward(dy)
    S = sum(SPLITS)
    y_ref, dx_ref, dw_ref, _ = reference(x, layer.weight, None, dy, SPLITS, recipe)
    close(y[:S], y_ref[:S], rtol=1e-2, atol=2e-2)
    close(x.grad, dx_ref, rtol=1e-2, atol=2e-2)
    close(layer.weight.grad, dw_ref, rtol=1e-2, atol=5e-2)


def test_reference_quantize_matches_plain_torch_fp8_current():
    x = torch.randn(T, K, dtype=F32) * 3
    got = qd(x, SPLITS, Float8CurrentScaling(fp8_format=Format.E4M3), "input")
    exp = torch.zeros_like(got)
    a = 0
    for m in SPLITS:
        if m:
            xg = x[a:a + m]
            scale = torch.tensor(448.0, dtype=F32) / xg.abs().max()
            exp[a:a + m] = (xg * scale).to(torch.float8_e4m3fn).float() * (1.0 / scale)
        a += m
    assert torch.equal(got, exp)


def test_reference_quantize_matches_plain_torch_mxfp8():
    x = torch.randn(T, K, dtype=F32) * 5
    got = qd(x, SPLITS, MXFP8BlockScaling(), "input")
    S = sum(SPLITS)
    blocks = x[:S].view(S, K // 32, 32)
    v = blocks.abs().amax(-1) * torch.tensor(1.0 / 448.0, dtype=F32)
    mant, ex = torch.frexp(v)  # v = mant · 2^ex, mant in [0.5, 1): 2^⌈log2 v⌉
    e = torch.where(mant == 0.5, ex - 1, ex).to(F32)
    q = (blocks * torch.pow(2.0, -e)[..., None]).to(torch.float8_e4m3fn).float()
    exp = (q * torch.pow(2.0, e)[..., None]).view(S, K)
    assert torch.equal(got[:S], exp)


@pytest.mark.parametrize("name", ["fp8-block", "nvfp4"])
def test_caller_buffers_through_the_recipe_path(name):
    recipe = RECIPES[name]()
    layer = mt.GroupedLinear(G, K, N, bias=True, params_dtype=F32, device="cpu")
    x = torch.randn(T, K, dtype=F32, requires_grad=True)
    dy = torch.randn(T, N, dtype=F32)
    with mt.autocast(recipe=recipe):
        y_own = layer(x, SPLITS)
    y_own.backward(dy)
    dx_own = x.grad.clone()
    x.grad = None
    out = torch.full((T, N), 7.0)
    dgrad = torch.full((T, K), 7.0)
    with mt.autocast(recipe=recipe):
        y = layer(x, SPLITS, out=out, dgrad_out=dgrad)
    assert y is out
    y.backward(dy)
    S = sum(SPLITS)
    assert torch.equal(out[:S], y_own[:S]) and torch.all(out[S:] == 7.0)
    assert torch.equal(dgrad[:S], dx_own[:S]) and torch.all(dgrad[S:] == 7.0)


def _quantizations(layer):
    return sum(l.weight_quantizations for l in layer._layers.values())


def test_weight_cache_follows_in_place_optimizer_steps():
    recipe = MXFP8BlockScaling()
    layer = mt.GroupedLinear(G, K, N, bias=False, params_dtype=F32, device="cpu")
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    x = torch.randn(T, K, dtype=F32)
    S = sum(SPLITS)

    def step_and_check(expected_quantizations):
        with mt.autocast(recipe=recipe):
            y = layer(x, SPLITS)
        y_ref = reference(x, layer.weight, None, torch.zeros(T, N), SPLITS, recipe)[0]
        close(y[:S], y_ref[:S])
        assert _quantizations(layer) == expected_quantizations
        return y

    y = step_and_check(1)
    y.sum().backward()
    step_and_check(1)  # unchanged weight: the cached copies
    opt.step()  # in place: torch's version counter moves, moekit re-quantizes
    step_and_check(2)
    with torch.no_grad():
        layer.weight.mul_(0.5)  # any in-place write through the parameter
    step_and_check(3)
    layer.weight.data = torch.randn(G, N, K)  # new storage: set_weight
    step_and_check(4)
    layer.weight.data.mul_(2.0)  # through .data: torch's counter does not see it ...
    layer.notify_weight_changed()  # ... so the caller says so (TE's is_first_microbatch role)
    step_and_check(5)


def test_ops_weight_cache_and_fused_sequential_under_a_recipe():
    recipe = NVFP4BlockScaling()
    fc1 = ops.GroupedLinear(G, K, 2 * 32, bias=False, device="cpu", dtype=F32)
    fc2 = ops.GroupedLinear(G, 32, N, bias=False, device="cpu", dtype=F32)
    seq = ops.Sequential(fc1, ops.ScaledSwiGLU(), fc2)
    assert seq.plan().startswith("GroupedMLP")
    x = torch.randn(T, K, dtype=F32, requires_grad=True)
    probs = torch.rand(T)
    with mt.autocast(recipe=recipe):
        assert seq.plan() == "GroupedMLP(0-2)"  # one recipe on both layers: the quantized MLP
        y = seq(x, SPLITS, probs, SPLITS)
    y.sum().backward()
    S = sum(SPLITS)
    w1, w2 = fc1.weight.detach(), fc2.weight.detach()

    def qlinear(inp, w):
        g, n, k = w.shape
        iq = qd(inp, SPLITS, recipe, "input").double()
        wq = qd(w.reshape(g * n, k), [n] * g, recipe, "weight").double().view(g, n, k)
        out, a = torch.zeros(inp.shape[0], n, dtype=torch.float64), 0
        for e, m in enumerate(SPLITS):
            out[a:a + m] = iq[a:a + m] @ wq[e].T
            a += m
        return out

    h = qlinear(x, w1)
    z = (torch.nn.functional.silu(h[:, :32]) * h[:, 32:] * probs.double()[:, None]).float()
    close(y[:S], qlinear(z, w2)[:S], rtol=1e-3, atol=1e-3)
    assert x.grad is not None and torch.isfinite(x.grad).all()
    quant = lambda op: sum(o.weight_quantizations for o in op._cpp.values())  # noqa: E731
    with mt.autocast(recipe=recipe):
        seq(x, SPLITS, probs, SPLITS)
    assert quant(fc1) == 1 and quant(fc2) == 1  # cached
    with torch.no_grad():
        fc1.weight.add_(1.0)
    with mt.autocast(recipe=recipe):
        seq(x, SPLITS, probs, SPLITS)
    assert quant(fc1) == 2 and quant(fc2) == 1


def test_autocast_nesting_and_disabled():
    layer = mt.GroupedLinear(G, K, N, bias=False, params_dtype=F32, device="cpu")
    x = torch.randn(T, K, dtype=F32)
    plain = layer(x, SPLITS)
    assert not mt.is_autocast_enabled()
    with mt.autocast(recipe=MXFP8BlockScaling()):
        assert mt.is_autocast_enabled()
        with mt.autocast(enabled=False):
            assert torch.equal(layer(x, SPLITS)[:96], plain[:96])
        with mt.autocast(recipe=NVFP4BlockScaling()):
            y4 = layer(x, SPLITS)
        y8 = layer(x, SPLITS)
    assert not mt.is_autocast_enabled()
    assert not torch.equal(y4[:96], y8[:96])
    close(y8[:96], reference(x, layer.weight, None, torch.zeros(T, N), SPLITS,
                             MXFP8BlockScaling())[0][:96])


class DelayedScaling:  # TE's default recipe, which moekit does not have
    pass


@pytest.mark.parametrize("make, field", [
    (lambda: Float8BlockScaling(x_block_scaling_dim=2), "x_block_scaling_dim"),
    (lambda: Float8BlockScaling(w_block_scaling_dim=1), "w_block_scaling_dim"),
    (lambda: NVFP4BlockScaling(disable_rht=False), "disable_rht"),
    (lambda: NVFP4BlockScaling(disable_stochastic_rounding=False), "disable_stochastic_rounding"),
    (lambda: NVFP4BlockScaling(disable_2d_quantization=False), "disable_2d_quantization"),
    (lambda: MXFP8BlockScaling(margin=1), "margin"),
    (lambda: MXFP8BlockScaling(fp8_format=Format.HYBRID), "fp8_format"),
    (lambda: Float8CurrentScaling(fp8_format=Format.E5M2), "fp8_format"),
    (lambda: Float8CurrentScaling(margin=-1), "margin"),
    (lambda: Float8CurrentScaling(amax_epsilon=-1.0), "amax_epsilon"),
    (lambda: Float8CurrentScaling(fp8_dpa=True), "fp8_dpa"),
    (lambda: Float8CurrentScaling(fp8_mha=True), "fp8_mha"),
    (lambda: Float8CurrentScaling(fp8_gemm_fprop=MMParams()), "fp8_gemm_fprop"),
    (lambda: Float8CurrentScaling(fp8_gemm_dgrad=MMParams(use_split_accumulator=False)), "fp8_gemm_dgrad"),
    (lambda: Float8CurrentScaling(fp8_gemm_wgrad=MMParams(False)), "fp8_gemm_wgrad"),
    (lambda: Float8CurrentScaling(fp8_gemm_wgrad=None), "fp8_gemm_wgrad"),
    (lambda: Float8BlockScaling(fp8_gemm_fprop=MMParams(False)), "fp8_gemm_fprop"),
    (lambda: Float8BlockScaling(fp8_gemm_dgrad=MMParams(False)), "fp8_gemm_dgrad"),
    (lambda: Float8CurrentScaling(backward_override="high_precision"), "backward_override"),
    (lambda: MXFP8BlockScaling(backward_override="dequantized"), "backward_override"),
])
def test_unsupported_fields_are_errors_naming_them(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_gemm_params_are_te_s_and_take_te_s_defaults():
    """TE's fp8_gemm_fprop / dgrad / wgrad MMParams fields, with the accumulation moekit's FP8
    kernels compute (TE's defaults): spelled out, a TE user's recipe constructs; set otherwise,
    or changed later, it is a ValueError naming the field; MMParams itself cannot be changed."""
    r = Float8CurrentScaling()
    assert (r.fp8_gemm_fprop, r.fp8_gemm_dgrad, r.fp8_gemm_wgrad) == (
        MMParams(use_split_accumulator=False), MMParams(True), MMParams(True))
    Float8CurrentScaling(fp8_gemm_fprop=MMParams(use_split_accumulator=False),
                         fp8_gemm_dgrad=MMParams(use_split_accumulator=True), fp8_gemm_wgrad=MMParams())
    b = Float8BlockScaling(fp8_gemm_fprop=MMParams(True))
    assert b.fp8_gemm_dgrad.use_split_accumulator and b.fp8_gemm_wgrad.use_split_accumulator
    with pytest.raises(ValueError, match="fp8_gemm_dgrad"):
        r.fp8_gemm_dgrad = MMParams(False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.fp8_gemm_wgrad.use_split_accumulator = False


def test_changed_field_is_checked_again():
    r = Float8CurrentScaling()
    r.margin = 2
    assert r.to_moekit().margin == 2
    with pytest.raises(ValueError, match="margin"):
        r.margin = -3


def test_autocast_errors():
    with pytest.raises(ValueError, match="recipe"):
        with mt.autocast():
            pass
    with pytest.raises(NotImplementedError, match="DelayedScaling"):
        with mt.fp8_autocast(fp8_recipe=DelayedScaling()):
            pass
    with pytest.raises(ValueError, match="calibrating"):
        with mt.autocast(calibrating=True, recipe=MXFP8BlockScaling()):
            pass
    assert not mt.is_autocast_enabled()


def test_recipe_alignment_errors_name_the_rule():
    x = torch.randn(40, 24, dtype=F32)
    with mt.autocast(recipe=Float8CurrentScaling()):
        with pytest.raises(ValueError, match="16"):
            mt.GroupedLinear(2, 24, 32, params_dtype=F32, device="cpu")(x, [20, 20])
        layer = mt.GroupedLinear(2, 32, 32, params_dtype=F32, device="cpu")
        with pytest.raises(ValueError):
            layer(torch.randn(40, 32), [20, 20])  # rows per group not multiples of 16
