"""moekit for PyTorch, with TransformerEngine's names: `moekit.torch.GroupedLinear` (TE's
te.pytorch.GroupedLinear: forward(inp, m_splits, out=None, dgrad_out=None)) and `moekit.torch.ops`
(GroupedLinear, ScaledSwiGLU, SwiGLU, Sequential(op_kwargs=...)). Autograd through
torch.autograd.Function; tensors reach moekit through DLPack (no torch C++ ABI).

Room for later issues: recipes (FP8, issue 40) arrive as an autocast-style context read by the
ops' forward; expert parallelism (issue 41) as moekit.torch.ep, whose dispatch / combine buffers
are the `out` / `grad_input` buffers these modules take.
"""
from . import ops  # noqa: F401
from .module import GroupedLinear  # noqa: F401
