"""moekit: the expert layers of Mixture-of-Experts models (grouped linear, grouped MLP, Sequential),
writing outputs and input gradients straight into caller-owned buffers.

`moekit._moekit` is the C++ library over DLPack tensors (numpy, torch, any producer; viewed,
never copied); `moekit.torch` the PyTorch modules (TE's names: GroupedLinear, ops.Sequential).
"""
from ._moekit import (  # noqa: F401
    Communicator,
    Context,
    ExpertParallel,
    GroupedLinear,
    GroupedLinearOp,
    Op,
    Recipe,
    ScaledSwiGLU,
    Sequential,
    Splits,
    SwiGLU,
    built_with_cuda,
    caller_communicator,
    cuda_device_count,
    quantize_dequantize,
    last_backend,
    zero_tail,
)

__version__ = "0.1.0"
