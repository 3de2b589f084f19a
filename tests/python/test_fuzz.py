"""Fuzzed shapes and splits (zero-row groups, tails, one group, many groups) for the module and
the fused MLP, against torch autograd in fp64."""
import random

import pytest
import torch

import moekit.torch as mt
from moekit.torch import ops
from conftest import DEVICES, assert_close, built_for
from reference import fp64_leaf, grouped_linear, grouped_mlp


def random_splits(rng, groups, rows):
    cuts = sorted(rng.randint(0, rows) for _ in range(groups - 1))
    splits = [b - a for a, b in zip([0] + cuts, cuts + [rows])]
    for g in rng.sample(range(groups), k=min(groups - 1, rng.randint(0, 2))):
        splits[g] = 0  # empty experts
    return splits


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_grouped_linear(device, seed):
    built_for(device)
    rng = random.Random(seed)
    G, K, N = rng.choice([1, 2, 5, 16]), 8 * rng.randint(1, 12), 8 * rng.randint(1, 12)
    splits = random_splits(rng, G, rng.randint(0, 200))
    T = sum(splits) + rng.choice([0, 0, 3])
    layer = mt.GroupedLinear(G, K, N, bias=rng.random() < 0.5, params_dtype=torch.float32,
                             device=device)
    x = torch.randn(T, K, device=device, requires_grad=True)
    # A CPU tensor: device counts on the CPU; read to the host for a CUDA op (fp32 has no
    # graph-safe GPU path, so device counts on the GPU would be refused: SPEC §1).
    y = layer(x, splits if rng.random() < 0.5 else torch.tensor(splits))
    dy = torch.randn_like(y)
    y.backward(dy)
    xr, wr = fp64_leaf(x), fp64_leaf(layer.weight)
    br = fp64_leaf(layer.bias) if layer.bias is not None else None
    yr = grouped_linear(xr, wr, br, splits)
    yr.backward(dy.double())
    S = sum(splits)
    assert_close(y[:S], yr[:S], torch.float32)
    assert_close(x.grad, xr.grad, torch.float32)
    assert_close(layer.weight.grad, wr.grad, torch.float32, scale=8)
    if br is not None:
        assert_close(layer.bias.grad, br.grad, torch.float32, scale=8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_fused_mlp(device, seed):
    built_for(device)
    rng = random.Random(100 + seed)
    G, H, F = rng.choice([1, 3, 8]), 8 * rng.randint(1, 8), 32 * rng.randint(1, 4)
    interleave = 32 if rng.random() < 0.5 else None
    splits = random_splits(rng, G, rng.randint(0, 150))
    T = sum(splits) + rng.choice([0, 5])
    fc1 = ops.GroupedLinear(G, H, 2 * F, bias=False, device=device, dtype=torch.float32)
    fc2 = ops.GroupedLinear(G, F, H, bias=True, scale_bias=True, device=device,
                            dtype=torch.float32)
    with torch.no_grad():
        fc2.bias.normal_()
    seq = ops.Sequential(fc1, ops.ScaledSwiGLU(glu_interleave_size=interleave), fc2)
    assert seq.plan() == "GroupedMLP(0-2)"
    x = torch.randn(T, H, device=device, requires_grad=True)
    probs = torch.rand(T, device=device, requires_grad=True)
    y = seq(x, splits, probs, splits, probs)
    dy = torch.randn_like(y)
    y.backward(dy)
    xr, pr, w1, w2, b2 = (fp64_leaf(t) for t in (x, probs, fc1.weight, fc2.weight, fc2.bias))
    yr = grouped_mlp(xr, w1, w2, pr, splits, b2, interleaved=interleave == 32)
    yr.backward(dy.double())
    S = sum(splits)
    assert_close(y[:S], yr[:S], torch.float32, scale=2)
    assert_close(x.grad, xr.grad, torch.float32, scale=2)
    assert_close(probs.grad, pr.grad, torch.float32, scale=8)
    assert_close(fc1.weight.grad, w1.grad, torch.float32, scale=16)
    assert_close(fc2.weight.grad, w2.grad, torch.float32, scale=16)
    assert_close(fc2.bias.grad, b2.grad, torch.float32, scale=16)
