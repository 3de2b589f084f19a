"""Plain-torch references (autograd in fp64) of moekit's ops."""
import torch
import torch.nn.functional as F


def offsets(splits):
    out, acc = [], 0
    for m in splits:
        out.append((acc, acc + m))
        acc += m
    return out


def grouped_linear(x, weight, bias, splits, scale=None):
    """y[rows of g] = x_g · W_gᵀ + (s_t ·) b_g; rows past sum(splits) are zero."""
    y = x.new_zeros(x.shape[0], weight.shape[1])
    parts = []
    for g, (a, b) in enumerate(offsets(splits)):
        yg = F.linear(x[a:b], weight[g])
        if bias is not None:
            yg = yg + (bias[g] * scale[a:b, None] if scale is not None else bias[g])
        parts.append(yg)
    s = sum(splits)
    return torch.cat(parts + [y[s:]], dim=0) if parts else y


def swiglu(h, probs=None, interleaved=False):
    f = h.shape[-1] // 2
    if interleaved:
        blocks = h.view(h.shape[0], -1, 2, 32)
        a, b = blocks[:, :, 0, :].reshape(h.shape[0], f), blocks[:, :, 1, :].reshape(h.shape[0], f)
    else:
        a, b = h[:, :f], h[:, f:]
    z = F.silu(a) * b
    return z * probs[:, None] if probs is not None else z


def grouped_mlp(x, w1, w2, probs, splits, b2=None, interleaved=False):
    h = grouped_linear(x, w1, None, splits)
    z = swiglu(h, probs, interleaved)
    return grouped_linear(z, w2, b2, splits, scale=probs)


def fp64_leaf(t):
    return t.detach().double().requires_grad_(True)
