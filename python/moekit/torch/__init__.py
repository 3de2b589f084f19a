"""moekit for PyTorch, with TransformerEngine's names: `moekit.torch.GroupedLinear` (TE's
te.pytorch.GroupedLinear: forward(inp, m_splits, out=None, dgrad_out=None)) and `moekit.torch.ops`
(GroupedLinear, ScaledSwiGLU, SwiGLU, Sequential(op_kwargs=...)). Autograd through
torch.autograd.Function; tensors reach moekit through DLPack (no torch C++ ABI).

Quantized recipes (issue 40) as TE's: `moekit.torch.recipe` (Float8CurrentScaling,
Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling, Format, MMParams) and `autocast(recipe=...)` /
`fp8_autocast(fp8_recipe=...)`, read by the modules at forward.

Expert parallelism (issue 41): `moekit.torch.ep` — ExpertParallel's dispatch / combine with
autograd over a group the caller runs (caller_communicator: its symmetric region and collectives);
the combine's input and the dispatch-backward's input are the `output` / `grad_input` buffers the
grouped MLP writes (zero copy).

Memory: moekit allocates from its own stream-ordered pool and keeps freed blocks for reuse;
`moekit.torch.empty_cache()` gives them back (beside torch.cuda.empty_cache());
`moekit.torch.memory_reserved()` says how much the pool holds.
"""
from . import ep  # noqa: F401
from . import ops  # noqa: F401
from . import recipe  # noqa: F401
from ._common import empty_cache, memory_reserved  # noqa: F401
from .module import GroupedLinear  # noqa: F401
from .recipe import autocast, fp8_autocast, is_autocast_enabled  # noqa: F401
