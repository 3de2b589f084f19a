"""What moekit.torch's modules share: contexts per (device, stream), DLPack hand-over, checks."""
from __future__ import annotations

import torch
from torch.utils.dlpack import from_dlpack as _from_capsule, to_dlpack as _to_capsule

from .. import _moekit
from . import recipe as _recipe

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_contexts: dict = {}


def empty_cache():
    """moekit's torch.cuda.empty_cache(): every context moekit.torch made gives back the memory
    moekit keeps for reuse (Context.release_cached_memory: the freed blocks its allocator keeps,
    then what its device's pool holds unused) — for a torch allocator that runs out of memory
    beside moekit's. Waits for those contexts' streams. Not while one of them is being captured
    into a CUDA graph (moekit raises)."""
    for ctx in list(_contexts.values()):
        ctx.release_cached_memory()


def memory_reserved(device=None) -> int:
    """moekit's torch.cuda.memory_reserved(): the bytes moekit's memory pool for `device` (default:
    the current CUDA device) holds from the driver — what moekit's tensors use, what its allocators
    keep for reuse and what the pool caches (all moekit contexts of a device share the pool).
    empty_cache() brings it down to what moekit's tensors use. 0 on the CPU."""
    device = default_device(device)
    for key, ctx in _contexts.items():
        if key[0] == "cuda" and key[1] == device.index:
            return ctx.memory_reserved
    return 0  # no moekit.torch context there: moekit.torch has made no memory on it


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPES:
        raise ValueError(f"moekit: unsupported dtype {dtype} (expected float32, float16 or bfloat16)")
    return _DTYPES[dtype]


def default_device(device) -> torch.device:
    """A module's device: the one given, else (as TE) CUDA, or the CPU where torch sees no GPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def context_for(device: torch.device):
    """(key, moekit Context) for `device` on torch's current stream there.

    A CUDA context borrows the stream (torch.cuda.current_stream().cuda_stream): every call runs
    on the stream torch would use. One context per (device, stream), made on first use; making one
    allocates, so run a module once on a stream before capturing a CUDA graph on it.
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type == "cpu":
        key = ("cpu",)
    elif device.type == "cuda":
        if not _moekit.built_with_cuda():
            raise NotImplementedError(
                "moekit: this build of moekit has no CUDA backend (built with MOEKIT_WITH_CUDA=OFF "
                "or without nvcc); CUDA tensors cannot be used")
        index = device.index if device.index is not None else torch.cuda.current_device()
        # torch's default stream is the legacy NULL stream, handle 0; moekit reads a null stream as
        # "make one of its own", so it gets cudaStreamLegacy ((cudaStream_t)1), the same stream.
        stream = _current_raw_stream(index) or 1
        key = ("cuda", index, stream)
    else:
        raise ValueError(f"moekit: unsupported device {device} (expected cpu or cuda)")
    ctx = _contexts.get(key)
    if ctx is None:
        if key[0] == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                f"moekit: no moekit context for the capturing stream {key[2]:#x} yet: run the "
                "module once on that stream before the capture (e.g. warm up inside "
                "torch.cuda.stream(s), then torch.cuda.graph(g, stream=s))")
        ctx = _moekit.Context.cpu() if key[0] == "cpu" else _moekit.Context.cuda(key[1], key[2])
        _contexts[key] = ctx
    return key, ctx


def _current_raw_stream(index: int) -> int:
    """torch's current stream on CUDA device `index` as a cudaStream_t (0: the legacy default
    stream). torch._C._cuda_getCurrentRawStream is what torch's own generated code calls: no
    torch.cuda.Stream object per query; torch.cuda.current_stream where a torch lacks it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def dl(t: torch.Tensor | None):
    """The tensor for moekit: itself on the CPU; on CUDA a DLPack capsule with no stream
    synchronisation (torch.utils.dlpack.to_dlpack, as __dlpack__(stream=-1) without its Python
    checks: the tensor is detached here and moekit's dtypes are real): moekit runs on the
    current stream, which it was given."""
    if t is None:
        return None
    t = t.detach()
    return _to_capsule(t) if t.is_cuda else t


def from_moekit(array) -> torch.Tensor | None:
    """A torch view of a tensor moekit allocated (owning a handle to its storage). From the
    array's capsule, not the array: torch.from_dlpack(array) queries the current stream and
    retries __dlpack__ with fewer keywords until nanobind's signature takes them; moekit wrote
    the array on the current stream, so no stream hand-over is needed."""
    return None if array is None else _from_capsule(array.__dlpack__())


def splits_for(m_splits, device: torch.device, groups: int):
    """m_splits (a list of ints, or an integer tensor [G]) as moekit takes them: a list is host
    counts; a tensor on the op's device is device counts (graph-safe on CUDA, no host sync); a CPU
    tensor for a CUDA op is read to a host list (as TE's legacy path)."""
    if isinstance(m_splits, torch.Tensor):
        if m_splits.dtype not in (torch.int32, torch.int64):
            m_splits = m_splits.to(torch.int64)
        if m_splits.device.type == "cpu" and torch.device(device).type != "cpu":
            return [int(v) for v in m_splits.tolist()], m_splits
        m_splits = m_splits.contiguous()  # kept by the caller: moekit views its memory
        return _moekit.Splits.device(dl(m_splits)), m_splits
    try:
        return [int(v) for v in m_splits], m_splits
    except TypeError:
        raise TypeError(f"moekit: m_splits must be a list of ints or an integer tensor, got "
                        f"{type(m_splits).__name__}") from None


def check_buffer(name: str, buf: torch.Tensor, shape, dtype: torch.dtype, device: torch.device):
    """A caller buffer, checked as TE PR #3161 does (shape, dtype, device, contiguity, not
    requiring grad), ValueError naming the buffer. moekit checks again (and overlap) in C++."""
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"moekit: {name} must be a torch.Tensor, got {type(buf).__name__}")
    if tuple(buf.shape) != tuple(shape):
        raise ValueError(f"moekit: {name} buffer shape {tuple(buf.shape)} must match required "
                         f"{tuple(shape)}")
    if buf.dtype != dtype:
        raise ValueError(f"moekit: {name} buffer dtype {buf.dtype} does not match required {dtype}")
    if buf.device != torch.device(device):
        raise ValueError(f"moekit: {name} buffer device {buf.device} does not match required "
                         f"{torch.device(device)}")
    if not buf.is_contiguous():
        raise ValueError(f"moekit: {name} buffer must be contiguous")
    if buf.requires_grad:
        raise ValueError(f"moekit: {name} buffer must not require gradient (reusing the output "
                         "of an earlier call as a buffer? pass buffer.detach())")


def zero_tail(t: torch.Tensor | None, m_splits) -> torch.Tensor | None:
    """Zeroes rows [S, T) of a gradient moekit allocated (moekit leaves them unwritten), so a
    padded tail gets the gradient it has, 0, and no uninitialised memory reaches autograd. Only
    the tail's bytes are written: host splits a slice; device splits moekit.zero_tail, which reads
    their sum on the device (no host sync)."""
    if t is None:
        return None
    rows = t.shape[0]
    if isinstance(m_splits, torch.Tensor) and m_splits.device == t.device:
        _, ctx = context_for(t.device)
        _moekit.zero_tail(ctx, dl(t), _moekit.Splits.device(dl(m_splits)))
    else:
        total = sum(int(v) for v in (m_splits.tolist() if isinstance(m_splits, torch.Tensor)
                                     else m_splits))
        if total < rows:
            t[total:].zero_()
    return t


def bind_weight(records: dict, layer, weight: torch.Tensor):
    """Gives moekit's layer (GroupedLinear or GroupedLinearOp) the module's weight, and keeps its
    quantized-weight cache (recipes, SPEC §6d) true to torch's weight: new storage → set_weight();
    the same storage written in place since the last call (torch's version counter, bumped by
    every in-place op on the parameter or a view of it: an optimizer step) →
    notify_weight_changed(); else nothing, so the cached copies are reused. `records` (per
    module, keyed by the layer) holds a detached alias of the bound weight: its storage cannot be
    freed and reused at the same address while moekit views it."""
    rec = records.get(id(layer))
    # An address names one memory of one device (CUDA's unified addressing), and the bound alias
    # keeps its storage alive: the same address, shape and dtype are the same weight.
    if rec is None or rec[0].data_ptr() != weight.data_ptr() or rec[0].shape != weight.shape \
            or rec[0].dtype != weight.dtype:
        layer.set_weight(dl(weight))
        records[id(layer)] = [weight.detach(), weight._version]
    elif rec[1] != weight._version:
        layer.notify_weight_changed()
        rec[1] = weight._version


def recipe_for(device: torch.device):
    """The active autocast recipe as (key, moekit.Recipe), or (None, None) outside one."""
    r = _recipe.active_recipe()
    if r is None:
        return None, None
    return r.key(), r.to_moekit()
