"""CUDA cases: moekit.torch on the GPU against torch._grouped_mm, on a side stream, and a whole
grouped-MLP step (forward + backward) captured with torch.cuda.graph and device split counts,
replayed with new counts. They run where torch sees a GPU; there a moekit without its CUDA path
fails them (built_for). On a CPU-only machine there is nothing to run them on."""
import pytest
import torch

import moekit.torch as mt
from moekit.torch import ops
from conftest import assert_close, built_for
from reference import fp64_leaf, grouped_mlp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no GPU visible to torch: CUDA cases need one")

BF16 = torch.bfloat16


def test_grouped_linear_matches_torch_grouped_mm():
    built_for("cuda")
    G, K, N = 4, 256, 128
    splits = torch.tensor([256, 0, 384, 128], dtype=torch.int32, device="cuda")
    S, T = 768, 832  # 64 tail rows
    layer = mt.GroupedLinear(G, K, N, bias=False, params_dtype=BF16, device="cuda")
    x = torch.randn(T, K, dtype=BF16, device="cuda", requires_grad=True)
    y = layer(x, splits)
    dy = torch.randn(T, N, dtype=BF16, device="cuda")
    y.backward(dy)
    offs = torch.cumsum(splits, 0, dtype=torch.int32)
    w = layer.weight.detach()
    y_ref = torch._grouped_mm(x.detach()[:S], w.transpose(-2, -1), offs=offs)
    dx_ref = torch._grouped_mm(dy[:S], w, offs=offs)
    assert_close(y[:S], y_ref, BF16)
    assert_close(x.grad[:S], dx_ref, BF16)
    assert torch.all(x.grad[S:] == 0)


def test_buffers_alias_on_a_side_stream():
    built_for("cuda")
    G, K, N = 4, 128, 64
    splits = [100, 0, 60, 36]
    layer = mt.GroupedLinear(G, K, N, bias=True, params_dtype=BF16, device="cuda")
    x = torch.randn(200, K, dtype=BF16, device="cuda", requires_grad=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = torch.full((200, N), 7.0, dtype=BF16, device="cuda")
        dgrad = torch.full((200, K), 7.0, dtype=BF16, device="cuda")
        y = layer(x, splits, out=out, dgrad_out=dgrad)
        y.backward(torch.ones_like(y))
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert y is out and torch.all(out[196:] == 7.0) and torch.all(dgrad[196:] == 7.0)
    xr, wr, br = fp64_leaf(x), fp64_leaf(layer.weight), fp64_leaf(layer.bias)
    parts, a = [], 0
    for g, m in enumerate(splits):
        parts.append(xr[a:a + m] @ wr[g].T + br[g])
        a += m
    torch.cat(parts).backward(torch.ones(196, N, dtype=torch.float64, device="cuda"))
    assert_close(out[:196], torch.cat(parts), BF16)
    assert_close(dgrad[:196], xr.grad[:196], BF16)


def test_mlp_step_captured_in_a_cuda_graph_replays_with_new_counts():
    built_for("cuda")
    G, H, F, T = 4, 128, 128, 1024
    # The weight gradients go to main_grad: outputs a replay must keep are caller buffers (SPEC §1).
    fc1 = ops.GroupedLinear(G, H, 2 * F, bias=False, device="cuda", dtype=BF16,
                            accumulate_into_main_grad=True)
    act = ops.ScaledSwiGLU(glu_interleave_size=32)
    fc2 = ops.GroupedLinear(G, F, H, bias=False, device="cuda", dtype=BF16,
                            accumulate_into_main_grad=True)
    for fc in (fc1, fc2):
        fc.weight.main_grad = torch.zeros(fc.weight.shape, device="cuda")
    seq = ops.Sequential(fc1, act, fc2)
    x = torch.randn(T, H, dtype=BF16, device="cuda", requires_grad=True)
    probs = torch.rand(T, device="cuda", requires_grad=True)
    splits = torch.tensor([256, 0, 512, 128], dtype=torch.int32, device="cuda")
    out = torch.full((T, H), 7.0, dtype=BF16, device="cuda")
    gin = torch.full((T, H), 7.0, dtype=BF16, device="cuda")
    dy = torch.randn(T, H, dtype=BF16, device="cuda")
    params = [x, probs]

    def step():
        for p in params:
            p.grad = None
        y = seq(x, splits, probs, splits,
                op_kwargs={fc2: {"output": out.detach()}, 0: {"grad_input": gin.detach()}})
        y.backward(dy)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on the capture stream: moekit's context for it
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        step()
    static_grads = [p.grad for p in params]  # replays write these (the .grad slots are Python's)

    for counts in ([128, 384, 0, 256], [0, 0, 1000, 24], [256, 256, 256, 256]):
        S = sum(counts)
        splits.copy_(torch.tensor(counts, dtype=torch.int32))
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
        out.fill_(7.0)
        gin.fill_(7.0)
        for fc in (fc1, fc2):
            fc.weight.main_grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        got = [out.clone(), gin.clone()] + [g.clone() for g in static_grads] + [
            fc.weight.main_grad.clone() for fc in (fc1, fc2)]
        if S < T:
            assert torch.all(got[0][S:] == 7.0) and torch.all(got[1][S:] == 7.0)
        # eager on the same device counts: the same kernels, bit for bit
        xe = x.detach().clone().requires_grad_(True)
        pe = probs.detach().clone().requires_grad_(True)
        for fc in (fc1, fc2):
            fc.weight.main_grad.zero_()
        ye = seq(xe, splits, pe, splits)
        ye.backward(dy)
        assert torch.equal(got[0][:S], ye[:S])
        assert torch.equal(got[2][:S], xe.grad[:S])
        assert torch.equal(got[3][:S], pe.grad[:S])
        assert torch.equal(got[4], fc1.weight.main_grad) and torch.equal(got[5], fc2.weight.main_grad)
        assert fc1.weight.grad is None
        # and the fp64 torch reference
        xr, pr = fp64_leaf(xe), fp64_leaf(pe)
        yr = grouped_mlp(xr, fc1.weight.detach().double(), fc2.weight.detach().double(), pr,
                         counts, interleaved=True)
        assert_close(got[0][:S], yr[:S], BF16, scale=4)


def test_delayed_weight_gradients_on_the_side_stream_equal_the_joined_ones():
    built_for("cuda")
    G, K, N = 4, 256, 128
    splits = torch.tensor([256, 64, 0, 192], dtype=torch.int32, device="cuda")
    ref = mt.GroupedLinear(G, K, N, bias=True, params_dtype=BF16, device="cuda")
    layer = mt.GroupedLinear(G, K, N, bias=True, params_dtype=BF16, device="cuda",
                             delay_wgrad_compute=True)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(512, K, dtype=BF16, device="cuda", requires_grad=True)
    dy = torch.randn(512, N, dtype=BF16, device="cuda")
    ref(x, splits).backward(dy)
    dx_ref = x.grad.clone()
    x.grad = None
    layer(x, splits).backward(dy)
    assert layer.weight.grad is None and len(layer._wgrad_store) == 1
    layer.backward_dw()
    torch.cuda.synchronize()
    assert torch.equal(x.grad, dx_ref)
    assert torch.equal(layer.weight.grad, ref.weight.grad)  # SPEC §1b: bit-identical
    assert torch.equal(layer.bias.grad, ref.bias.grad)


def _recipe(name):
    from moekit.torch.recipe import (Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling,
                                     NVFP4BlockScaling)
    return {"fp8-current": lambda: Float8CurrentScaling(),
            "fp8-current-pow2": lambda: Float8CurrentScaling(use_power_2_scales=True),
            "fp8-block": lambda: Float8BlockScaling(),
            "fp8-block-fp32-scales": lambda: Float8BlockScaling(use_power_2_scales=False),
            "mxfp8": lambda: MXFP8BlockScaling(),
            "nvfp4": lambda: NVFP4BlockScaling()}[name]()


@pytest.mark.parametrize("recipe_name", ["fp8-block-fp32-scales", "fp8-current"])
def test_recipes_without_a_gpu_path_raise_naming_the_recipe(recipe_name):
    """SPEC §6d: an fp8 recipe with fp32 scales in an fp32 layer has no GPU path (the FP8 GEMMs
    write bf16 or fp16; the bf16 path needs power-of-two scales): NotImplementedError naming the
    recipe, before any work (never a silent fallback)."""
    built_for("cuda")
    F32 = torch.float32
    layer = mt.GroupedLinear(2, 128, 128, bias=False, params_dtype=F32, device="cuda")
    x = torch.randn(256, 128, dtype=F32, device="cuda")
    out = torch.full((256, 128), 7.0, dtype=F32, device="cuda")
    with mt.autocast(recipe=_recipe(recipe_name)):
        with pytest.raises(NotImplementedError, match=recipe_name.replace("-fp32-scales", "")):
            layer(x, [128, 128], out=out)
    torch.cuda.synchronize()
    assert torch.all(out == 7.0)  # nothing written


def _gpu_matches_cpu(recipe_name, rtol, atol_of_scale, dtype=BF16):
    built_for("cuda")
    G, K, N, T = 3, 128, 128, 256
    splits = [128, 0, 96]
    cpu = mt.GroupedLinear(G, K, N, bias=True, params_dtype=dtype, device="cpu")
    gpu = mt.GroupedLinear(G, K, N, bias=True, params_dtype=dtype, device="cuda")
    with torch.no_grad():
        gpu.weight.copy_(cpu.weight)
        cpu.bias.normal_()
        gpu.bias.copy_(cpu.bias)
    x = torch.randn(T, K, dtype=dtype, requires_grad=True)
    xg = x.detach().cuda().requires_grad_(True)
    dy = torch.randn(T, N, dtype=dtype)
    with mt.autocast(recipe=_recipe(recipe_name)):
        y = cpu(x, splits)
        yg = gpu(xg, torch.tensor(splits, dtype=torch.int32, device="cuda"))
    y.backward(dy)
    yg.backward(dy.cuda())
    S = sum(splits)
    for got, want in ((yg[:S], y[:S]), (xg.grad[:S], x.grad[:S]),
                      (gpu.weight.grad, cpu.weight.grad), (gpu.bias.grad, cpu.bias.grad)):
        got, want = got.float().cpu(), want.float()
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol_of_scale * scale)


@pytest.mark.parametrize("recipe_name", ["mxfp8"])
def test_power_of_two_recipes_on_the_gpu_match_the_cpu_in_bf16(recipe_name):
    """SPEC §6d: mxfp8 (e8m0 scales: powers of two) runs on the bf16 tensor cores (exact bf16
    operands); forward and backward equal the CPU reference up to the fp32 summation order,
    i.e. within one bf16 rounding of each output, with device split counts."""
    # one bf16 rounding apart at most (2^-8 relative), plus the fp32 order at small values
    _gpu_matches_cpu(recipe_name, 2 ** -7, 2 ** -12)


@pytest.mark.parametrize("recipe_name",
                         ["fp8-current", "fp8-current-pow2", "fp8-block", "fp8-block-fp32-scales"])
def test_fp8_recipes_on_the_native_fp8_gemms_match_the_cpu(recipe_name):
    """SPEC §6d: fp8-current (per-group scales) and fp8-block (1x128 / 128x128 blocks), fp32 or
    power-of-two scales, run on the native FP8 GEMMs; forward and backward equal the CPU
    reference within the FP8 tensor cores' accumulation (products aligned to ~14 bits per MMA
    step) and one bf16 rounding."""
    _gpu_matches_cpu(recipe_name, 2 ** -7, 2 ** -9)


@pytest.mark.parametrize("recipe_name", ["fp8-current", "fp8-block-fp32-scales"])
def test_fp8_recipes_in_an_fp16_layer_run_on_the_native_fp8_gemms(recipe_name):
    """SPEC §6d: an fp16 layer's FP8 GEMMs write fp16 (cuda-fp8's f16 instances); forward and
    backward equal the CPU reference as in bf16 (fp16 rounds finer)."""
    _gpu_matches_cpu(recipe_name, 2 ** -7, 2 ** -9, dtype=torch.float16)


@pytest.mark.parametrize("recipe_name", ["mxfp8", "nvfp4"])
def test_emulated_recipes_on_the_gpu_match_the_cpu(recipe_name):
    """SPEC §6d: mxfp8 / nvfp4 run on the GPU as the documented emulation (dequantize + fp32
    GEMM); forward and backward equal the CPU reference within fp32 accumulation tolerance,
    with device split counts."""
    built_for("cuda")
    from moekit.torch.recipe import MXFP8BlockScaling, NVFP4BlockScaling
    recipe = MXFP8BlockScaling() if recipe_name == "mxfp8" else NVFP4BlockScaling()
    G, K, N, T = 3, 128, 64, 256
    splits = [64, 0, 160]
    cpu = mt.GroupedLinear(G, K, N, bias=True, params_dtype=torch.float32, device="cpu")
    gpu = mt.GroupedLinear(G, K, N, bias=True, params_dtype=torch.float32, device="cuda")
    with torch.no_grad():
        gpu.weight.copy_(cpu.weight)
        cpu.bias.normal_()
        gpu.bias.copy_(cpu.bias)
    x = torch.randn(T, K, requires_grad=True)
    xg = x.detach().cuda().requires_grad_(True)
    dy = torch.randn(T, N)
    with mt.autocast(recipe=recipe):
        y = cpu(x, splits)
        yg = gpu(xg, torch.tensor(splits, dtype=torch.int32, device="cuda"))
    y.backward(dy)
    yg.backward(dy.cuda())
    S = sum(splits)
    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(yg[:S].cpu(), y[:S], **tol)
    torch.testing.assert_close(xg.grad.cpu(), x.grad, **tol)
    torch.testing.assert_close(gpu.weight.grad.cpu(), cpu.weight.grad, **tol)
    torch.testing.assert_close(gpu.bias.grad.cpu(), cpu.bias.grad, **tol)


def test_ep_layer_step_on_a_gpu_captures_and_replays_with_new_routing():
    """moekit.torch.ep on the GPU: a caller group of one rank over a region torch allocated (its
    calls agree in band: no host collective, so the step captures). dispatch → the grouped MLP
    writing the combine's buffer (zero copy) → combine, loss.backward(): captured with
    torch.cuda.graph, replayed with new routing in place, bit-identical to the same step run
    eagerly on a second ExpertParallel; the eager step against an fp64 torch reference."""
    built_for("cuda")
    from moekit.torch.ep import ExpertParallel, caller_communicator
    E, H, F, T, K = 4, 64, 32, 48, 2
    R = T * K
    need = ExpertParallel.symmetric_bytes(E, H, K, T, R, 1, dtype=BF16, device="cuda")

    def group():
        region = torch.zeros(need, dtype=torch.uint8, device="cuda")
        comm = caller_communicator(0, 1, region, [region.data_ptr()], lambda: None, lambda b: [b])
        return region, comm

    w1 = torch.randn(E, 2 * F, H, device="cuda") / H ** 0.5
    w2 = torch.randn(E, H, F, device="cuda") / F ** 0.5

    def layer(comm):
        ep = ExpertParallel(comm, E, H, K, T, R, dtype=BF16)
        fc1 = ops.GroupedLinear(E, H, 2 * F, bias=False, device="cuda", dtype=BF16)
        fc2 = ops.GroupedLinear(E, F, H, bias=False, device="cuda", dtype=BF16)
        with torch.no_grad():
            fc1.weight.copy_(w1)
            fc2.weight.copy_(w2)
        return ep, fc1, ops.Sequential(fc1, ops.ScaledSwiGLU(), fc2), fc2

    def routing(seed):
        g = torch.Generator().manual_seed(seed)
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        return idx.cuda(), (torch.rand(T, K, generator=g) + 0.1).cuda()

    x = torch.randn(T, H, dtype=BF16, device="cuda", requires_grad=True)
    idx, w0 = routing(1)
    w = w0.clone().requires_grad_(True)
    dy = torch.randn(T, H, dtype=BF16, device="cuda")

    def step(ep, fc1, mlp, fc2, x, idx, w):
        for p in (x, w):
            p.grad = None
        recv, splits, probs, handle = ep.dispatch(x, idx, w)
        y_exp = mlp(recv, splits, probs, splits,
                    op_kwargs={fc2: {"output": ep.combine_input},
                               fc1: {"grad_input": ep.dispatch_backward_input}})
        y = ep.combine(handle, y_exp)
        y.backward(dy)
        return y

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # the group runs on the stream current at its construction: s
        region_g, comm_g = group()
        graphed = layer(comm_g)
        for _ in range(2):  # warm-up on the capture stream
            step(*graphed, x, idx, w)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        y_static = step(*graphed, x, idx, w)
    grads = (x.grad, w.grad)

    region_e, comm_e = group()
    eager = layer(comm_e)
    for seed in (2, 3, 4):
        new_idx, new_w = routing(seed)
        idx.copy_(new_idx)
        with torch.no_grad():
            w.copy_(new_w)
        graph.replay()
        torch.cuda.synchronize()
        xe = x.detach().clone().requires_grad_(True)
        we = w.detach().clone().requires_grad_(True)
        ye = step(*eager, xe, idx, we)
        torch.cuda.synchronize()
        assert torch.equal(y_static, ye), f"y, routing {seed}"
        assert torch.equal(grads[0], xe.grad), f"dx, routing {seed}"
        assert torch.equal(grads[1], we.grad), f"d topk_weights, routing {seed}"
        # fp64: y_t = sum_j MLP_e(x_t) with probs w_tj, e = idx[t, j]
        x64, ref = xe.detach().double(), torch.zeros(T, H, dtype=torch.float64, device="cuda")
        for t in range(T):
            for j in range(K):
                e = int(idx[t, j])
                h = w1[e].to(BF16).double() @ x64[t]
                z = we[t, j].double() * torch.nn.functional.silu(h[:F]) * h[F:]
                ref[t] += w2[e].to(BF16).double() @ z
        assert_close(ye, ref, BF16, scale=4)
