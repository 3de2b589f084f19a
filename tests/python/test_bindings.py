"""moekit._moekit over numpy and torch CPU tensors: views, not copies; moekit's tensors come
back through DLPack; errors arrive as ValueError with the C++ message."""
import numpy as np
import pytest
import torch

import moekit

G, K, N = 3, 16, 8
SPLITS = [4, 0, 5]
T = 11


def layer(dtype="f32"):
    ctx = moekit.Context.cpu()
    fc = moekit.GroupedLinear(ctx, G, K, N, dtype, bias=False)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((G, N, K), dtype=np.float32)
    fc.set_weight(w)
    return fc, w, rng


def test_numpy_forward_writes_the_output_buffer_in_place():
    fc, w, rng = layer()
    x = rng.standard_normal((T, K), dtype=np.float32)
    out = np.full((T, N), 7.0, dtype=np.float32)
    y, saved = fc.forward(x, SPLITS, output=out)
    assert np.from_dlpack(y).__array_interface__["data"][0] == out.__array_interface__["data"][0]
    ref = np.concatenate([x[0:4] @ w[0].T, x[4:9] @ w[2].T])
    np.testing.assert_allclose(out[:9], ref, rtol=1e-5, atol=1e-5)
    assert np.all(out[9:] == 7.0)
    dx, dw, db, pending = fc.backward(saved, np.ones((T, N), dtype=np.float32))
    assert not pending.pending  # nothing deferred
    dx, dw = np.from_dlpack(dx), np.from_dlpack(dw)
    assert dx.shape == (T, K) and dw.shape == (G, N, K) and db is None
    np.testing.assert_allclose(dw[1], 0)


def test_internal_outputs_come_back_without_a_copy():
    fc, w, rng = layer()
    x = rng.standard_normal((T, K), dtype=np.float32)
    y, _ = fc.forward(x, SPLITS, save=False)
    a, b = np.from_dlpack(y), torch.from_dlpack(y)
    assert a.__array_interface__["data"][0] == b.data_ptr()


def test_torch_cpu_tensors_and_device_splits():
    fc, w, rng = layer()
    x = torch.randn(T, K)
    splits = moekit.Splits.device(torch.tensor(SPLITS, dtype=torch.int32))
    y1, _ = fc.forward(x, splits, save=False)
    y2, _ = fc.forward(x, SPLITS, save=False)
    assert torch.equal(torch.from_dlpack(y1)[:9], torch.from_dlpack(y2)[:9])


def test_errors_are_value_errors_with_the_cpp_message():
    fc, w, rng = layer()
    x = rng.standard_normal((T, K), dtype=np.float32)
    with pytest.raises(ValueError, match=r"invalid argument 'output': expected shape \[11, 8\]"):
        fc.forward(x, SPLITS, output=np.empty((T + 1, N), dtype=np.float32))
    with pytest.raises(ValueError, match="'output'.*f32"):
        fc.forward(x, SPLITS, output=np.empty((T, N), dtype=np.float64))
    with pytest.raises(ValueError, match="'output'.*contiguous"):
        fc.forward(x, SPLITS, output=np.empty((N, T), dtype=np.float32).T)
    with pytest.raises(ValueError, match="splits"):
        fc.forward(x, [1, 2], save=False)
    with pytest.raises(TypeError):
        fc.forward("not a tensor", SPLITS)
    with pytest.raises(ValueError, match="known names|backend"):
        fc2 = moekit.GroupedLinear(moekit.Context.cpu().with_backend("nonesuch"), G, K, N, "f32")
        fc2.set_weight(w)
        fc2.forward(x, SPLITS, save=False)


def test_one_backward_per_forward():
    fc, w, rng = layer()
    x = rng.standard_normal((T, K), dtype=np.float32)
    _, saved = fc.forward(x, SPLITS)
    dy = np.ones((T, N), dtype=np.float32)
    fc.backward(saved, dy, retain_saved=True)
    fc.backward(saved, dy)
    with pytest.raises(ValueError, match="saved"):
        fc.backward(saved, dy)


def test_sequential_plan_and_build_facts():
    ctx = moekit.Context.cpu()
    fc1 = moekit.GroupedLinearOp(ctx, G, K, 2 * 32, "f32")
    act = moekit.ScaledSwiGLU(ctx)
    fc2 = moekit.GroupedLinearOp(ctx, G, 32, K, "f32")
    assert moekit.Sequential([fc1, act, fc2]).plan() == "GroupedMLP(0-2)"
    assert act.kind == "ScaledSwiGLU"
    assert isinstance(moekit.built_with_cuda(), bool) and moekit.cuda_device_count() >= 0


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("form", ["host", "i32", "i64"])
def test_zero_tail_zeroes_rows_past_s_and_nothing_else(device, form):
    """moekit.zero_tail (what moekit.torch zeroes a gradient's tail with): rows [S, T) set to 0,
    rows [0, S) untouched, for host counts and device counts of both dtypes; S > T refused."""
    from conftest import built_for
    from moekit.torch._common import context_for, dl
    built_for(device)
    _, ctx = context_for(torch.device(device))
    t = torch.randn(T, 3, 5, device=device).to(torch.bfloat16)  # a row is 15 elements, 30 bytes
    before = t.clone()
    splits = SPLITS if form == "host" else moekit.Splits.device(dl(torch.tensor(
        SPLITS, dtype=torch.int32 if form == "i32" else torch.int64, device=device)))
    moekit.zero_tail(ctx, dl(t), splits)
    if device == "cuda":
        torch.cuda.synchronize()
    S = sum(SPLITS)
    assert torch.equal(t[:S], before[:S])
    assert torch.all(t[S:] == 0)
    with pytest.raises(ValueError, match=r"'splits'.*S <= T = 11"):
        moekit.zero_tail(ctx, dl(t), [12])
