"""moekit.torch.GroupedLinear: TE PR #3161's checks (out= / dgrad_out=) and gradients against
torch autograd of per-expert F.linear in fp64."""
import pytest
import torch

import moekit.torch as mt
from conftest import DEVICES, assert_close, built_for
from reference import fp64_leaf, grouped_linear

SPLITS = [5, 0, 9, 3]  # a zero-row group; S = 17
T = 21                 # 4 tail rows past S
K, N = 32, 24


def make(device, dtype=torch.float32, bias=True, **kw):
    built_for(device)
    layer = mt.GroupedLinear(len(SPLITS), K, N, bias=bias, params_dtype=dtype, device=device, **kw)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()
    x = torch.randn(T, K, device=device, dtype=dtype, requires_grad=True)
    return layer, x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_gradients_match_fp64_torch(device, dtype, bias):
    layer, x = make(device, dtype, bias)
    y = layer(x, SPLITS)
    dy = torch.randn_like(y)
    y.backward(dy)
    xr, wr = fp64_leaf(x), fp64_leaf(layer.weight)
    br = fp64_leaf(layer.bias) if bias else None
    yr = grouped_linear(xr, wr, br, SPLITS)
    yr.backward(dy.double())
    S = sum(SPLITS)
    assert_close(y[:S], yr[:S], dtype)
    assert_close(x.grad, xr.grad, dtype)           # tail rows: gradient 0
    assert torch.all(x.grad[S:] == 0)
    assert_close(layer.weight.grad, wr.grad, dtype, scale=4)
    assert torch.all(layer.weight.grad[1] == 0)    # the zero-row group
    if bias:
        assert_close(layer.bias.grad, br.grad, dtype, scale=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["out", "dgrad_out", "both"])
def test_caller_buffers_alias_are_bit_exact_and_keep_the_tail(device, which):
    layer, x = make(device)
    dy = torch.randn(T, N, device=device)
    y_ref = layer(x, SPLITS)
    y_ref.backward(dy)
    dx_ref = x.grad.clone()
    x.grad = None
    S = sum(SPLITS)
    out = torch.full((T, N), 7.0, device=device) if which in ("out", "both") else None
    dgrad = torch.full((T, K), 7.0, device=device) if which in ("dgrad_out", "both") else None
    y = layer(x, SPLITS, out=out, dgrad_out=dgrad)
    if out is not None:
        assert y is out and y.data_ptr() == out.data_ptr() and y.shape == (T, N)
        assert torch.all(out[S:] == 7.0)
    assert torch.equal(y[:S], y_ref[:S])
    y.backward(dy)
    if dgrad is not None:
        assert torch.all(dgrad[S:] == 7.0)
        assert torch.equal(dgrad[:S], dx_ref[:S])
    assert torch.equal(x.grad[:S], dx_ref[:S])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["out", "dgrad_out"])
@pytest.mark.parametrize("wrong", ["shape", "dtype", "device", "contiguity", "requires_grad"])
def test_wrong_buffer_is_a_value_error_naming_it(device, name, wrong):
    layer, x = make(device)
    cols = N if name == "out" else K
    buf = {
        "shape": lambda: torch.empty(T + 1, cols, device=device),
        "dtype": lambda: torch.empty(T, cols, device=device, dtype=torch.float16),
        "device": lambda: torch.empty(T, cols, device="meta"),
        "contiguity": lambda: torch.empty(cols, T, device=device).t(),
        "requires_grad": lambda: torch.empty(T, cols, device=device, requires_grad=True),
    }[wrong]()
    with pytest.raises(ValueError, match=name):
        layer(x, SPLITS, **{name: buf})


@pytest.mark.parametrize("device", DEVICES)
def test_reused_output_must_be_detached(device):
    layer, x = make(device)
    out = torch.empty(T, N, device=device)
    y = layer(x, SPLITS, out=out)
    with pytest.raises(ValueError, match="must not require gradient"):
        layer(x, SPLITS, out=y)
    layer(x, SPLITS, out=y.detach())


@pytest.mark.parametrize("device", DEVICES)
def test_main_grad_accumulates_and_weight_grad_stays_none(device):
    layer, x = make(device, fuse_wgrad_accumulation=True)
    layer.weight.main_grad = torch.full_like(layer.weight, 0.5, dtype=torch.float32)
    dy = torch.randn(T, N, device=device)
    for _ in range(2):
        layer(x, SPLITS).backward(dy)
    xr, wr = fp64_leaf(x), fp64_leaf(layer.weight)
    grouped_linear(xr, wr, None, SPLITS).backward(dy.double())
    assert layer.weight.grad is None
    assert_close(layer.weight.main_grad, 0.5 + 2 * wr.grad, torch.float32, scale=8)
    assert torch.all(layer.weight.main_grad[1] == 0.5)  # zero-row group: unchanged


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["int64", "int32", "list"])
def test_splits_as_list_or_tensor_agree(device, kind):
    # bf16 on the GPU: device counts need a graph-safe path, which fp32 has not (SPEC §1)
    layer, x = make(device, torch.bfloat16 if device == "cuda" else torch.float32)
    ref = layer(x, SPLITS)
    splits = SPLITS if kind == "list" else torch.tensor(SPLITS, dtype=getattr(torch, kind),
                                                          device=device)
    y = layer(x, splits)
    if device == "cpu":
        assert torch.equal(y[:17], ref[:17])
    else:  # host and device counts may take different GPU backends (cuBLAS, sm90)
        assert_close(y[:17], ref[:17], torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_moekit_argument_errors_are_value_errors_with_the_message(device):
    layer, x = make(device)
    with pytest.raises(ValueError, match="splits"):
        layer(x, [1, 2, 3])                 # 3 counts for 4 groups
    with pytest.raises(ValueError, match="splits"):
        layer(x, [20, 0, 0, 2])             # S = 22 > T = 21
    with pytest.raises(ValueError, match="in_features"):
        layer(torch.randn(T, K + 1, device=device), SPLITS)


@pytest.mark.parametrize("device", DEVICES)
def test_all_groups_empty_gives_zero_weight_grad(device):
    layer, x = make(device)
    layer(x, [0, 0, 0, 0]).sum().backward()
    assert torch.all(layer.weight.grad == 0) and torch.all(layer.bias.grad == 0)
    assert torch.all(x.grad == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_inference_and_3d_input(device):
    layer, x = make(device)
    with torch.no_grad():
        y = layer(x.view(3, 7, K), SPLITS)
    assert y.shape == (3, 7, N) and not y.requires_grad
    assert torch.equal(y.reshape(T, N)[:17], layer(x, SPLITS)[:17].detach())


def test_a_module_cast_to_another_dtype_keeps_working():
    layer, x = make("cpu")
    y32 = layer(x, SPLITS)
    layer.to(torch.bfloat16)
    y16 = layer(x.detach().to(torch.bfloat16), SPLITS)
    assert y16.dtype == torch.bfloat16
    assert_close(y16[:17], y32[:17], torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("main_grad", [False, True])
def test_delayed_weight_gradients_arrive_at_backward_dw(device, main_grad):
    ref, x = make(device, fuse_wgrad_accumulation=main_grad)
    layer = mt.GroupedLinear(len(SPLITS), K, N, bias=True, params_dtype=torch.float32,
                             device=device, fuse_wgrad_accumulation=main_grad,
                             delay_wgrad_compute=True)
    layer.load_state_dict(ref.state_dict())
    for m in (ref, layer):
        if main_grad:
            m.weight.main_grad = torch.zeros(m.weight.shape, device=device)
    dy = torch.randn(T, N, device=device)
    ref(x, SPLITS).backward(dy)
    dx_ref = x.grad.clone()
    x.grad = None
    for _ in range(2):  # two backwards before backward_dw: their gradients add up
        layer(x, SPLITS).backward(dy)
    assert layer.weight.grad is None and layer.bias.grad is not None  # db in the main backward
    assert torch.equal(x.grad, 2 * dx_ref)
    layer.backward_dw()
    if main_grad:
        assert layer.weight.grad is None
        assert torch.equal(layer.weight.main_grad, 2 * ref.weight.main_grad)
    else:
        assert torch.equal(layer.weight.grad, 2 * ref.weight.grad)
    assert torch.equal(layer.bias.grad, 2 * ref.bias.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_cache_gives_memory_back_and_the_next_step_still_matches(device):
    """moekit.torch.empty_cache(): every context moekit.torch made releases the memory moekit keeps
    (on a GPU the kept blocks and its pool's unused memory: moekit's reserved memory never grows;
    the C++ case CudaRuntime.ReleaseCachedMemory... checks that a kept block goes back); the
    layer's next step gives the same bits as before it."""
    layer, x = make(device)
    dy = torch.randn(T, N, device=device)
    S = sum(SPLITS)
    y1 = layer(x, SPLITS)
    y1.backward(dy)
    y1, dx1, dw1 = y1[:S].detach().clone(), x.grad.clone(), layer.weight.grad.clone()
    reserved_with_grads = mt.memory_reserved(device)
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None  # moekit's memory, freed
    mt.empty_cache()
    if device == "cuda":
        # these gradients are small: they share the pool's chunks with what stays in use
        assert 0 < mt.memory_reserved(device) <= reserved_with_grads
    else:
        assert reserved_with_grads == 0 and mt.memory_reserved(device) == 0
    y2 = layer(x, SPLITS)
    y2.backward(dy)
    assert torch.equal(y1, y2[:S]) and torch.equal(x.grad, dx1) and torch.equal(layer.weight.grad, dw1)
