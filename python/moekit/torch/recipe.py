"""Quantized recipes as TransformerEngine users know them (transformer_engine.common.recipe) and
TE's autocast context (te.pytorch.autocast(recipe=...), the older fp8_autocast(fp8_recipe=...)).

    from moekit.torch import autocast, recipe
    with autocast(recipe=recipe.MXFP8BlockScaling()):
        y = layer(x, m_splits)          # the layer's GEMMs run on MXFP8 operands
    y.sum().backward()                  # backward uses the forward's recipe (outside the context)

The modules read the active recipe at forward (SPEC §8): moekit's recipe is per C++ layer
(GroupedLinearConfig::recipe), so a module holds one moekit layer per (device, stream, dtype,
recipe) and the forward picks the one of the active recipe; each has its own quantized-weight
cache, invalidated whenever torch's weight version (`weight._version`: every in-place write
through the parameter, an optimizer step included) or its storage changed.

Fields are TE's, with TE's defaults where moekit has the feature; a value moekit does not support
is a ValueError naming the field at construction (NotImplementedError for a TE recipe class that
moekit does not have, e.g. DelayedScaling). moekit's defaults differ from TE's only where TE's is
a feature moekit lacks: NVFP4BlockScaling's disable_rht / disable_stochastic_rounding /
disable_2d_quantization default to True (moekit has no random Hadamard transform, stochastic
rounding or 2-D weight blocks yet; TE's default False is an error). backward_override (TE's
'high_precision' / 'dequantized' backward) is None only, and moekit does not read TE's
NVTE_BACKWARD_OVERRIDE default from the environment.
"""
from __future__ import annotations

import dataclasses
import enum
import threading
from contextlib import contextmanager

from .. import _moekit


class Format(enum.Enum):
    """TE's recipe.Format. HYBRID: e4m3 forward tensors (x, W), e5m2 gradients (dy)."""
    E2M1 = "e2m1"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"


def _unsupported(recipe, field, value, expected):
    raise ValueError(f"moekit: {type(recipe).__name__}.{field}={value!r} is not supported by "
                     f"moekit (expected {expected})")


class Recipe:
    """Base of moekit's recipes (TE's recipe.Recipe)."""

    _name = "none"

    def _check_common(self):
        for field in ("fp8_dpa", "fp8_mha"):
            if getattr(self, field, False):
                _unsupported(self, field, True, "False: moekit has no attention")
        if self.backward_override is not None:
            _unsupported(self, "backward_override", self.backward_override,
                         "None: moekit's backward reads the quantized operands (TE's default)")
        fmt = getattr(self, "fp8_format", Format.E4M3)
        if not isinstance(fmt, Format):
            raise ValueError(f"moekit: {type(self).__name__}.fp8_format must be a "
                             f"moekit.torch.recipe.Format, got {fmt!r}")

    def _cpp_args(self) -> dict:
        raise NotImplementedError

    def to_moekit(self):
        """The C++ moekit.Recipe (validated there too: ValueError naming the field)."""
        cpp = self.__dict__.get("_cpp")
        if cpp is None:
            cpp = _moekit.Recipe.make(self._name, **self._cpp_args())
            object.__setattr__(self, "_cpp", cpp)
        return cpp

    def key(self) -> tuple:
        """What distinguishes two recipes for moekit (the module's layer cache key)."""
        c = self.to_moekit()
        return (c.name, c.fp8_format, c.power_2_scales, c.amax_epsilon, c.margin)

    def __setattr__(self, name, value):  # fields changed after construction: check again
        object.__setattr__(self, name, value)
        if dataclasses.is_dataclass(self) and name in {f.name for f in dataclasses.fields(self)}:
            self.__dict__.pop("_cpp", None)
            if getattr(self, "_ready", False):
                self.__post_init__()

    def __post_init__(self):
        self._check()
        self.__dict__.pop("_cpp", None)
        self.to_moekit()  # the C++ checks now, not at the first forward
        object.__setattr__(self, "_ready", True)


@dataclasses.dataclass(frozen=True)
class MMParams:
    """TE's recipe.MMParams: how an FP8 GEMM accumulates. use_split_accumulator: the tensor cores'
    partial sums promoted to fp32 as the GEMM goes (TE's split accumulator) rather than kept in
    their own accumulation. moekit's FP8 kernels compute TE's defaults, and only those: fp8-current
    fprop fast (False), dgrad and wgrad promoted (True); fp8-block promoted everywhere (TE requires
    it). Another value is a ValueError naming the field. Frozen: a recipe's GEMMs change only by
    assigning the recipe's field, which is checked again."""
    use_split_accumulator: bool = True


def _check_gemms(recipe, fprop_split: bool):
    """The recipe's fp8_gemm_* fields: MMParams with the accumulation moekit's kernels compute."""
    for field, split in (("fp8_gemm_fprop", fprop_split), ("fp8_gemm_dgrad", True),
                         ("fp8_gemm_wgrad", True)):
        value = getattr(recipe, field)  # moekit's MMParams or TE's (the same field)
        if getattr(value, "use_split_accumulator", None) != split:
            _unsupported(recipe, field, value,
                         f"MMParams(use_split_accumulator={split}): the accumulation moekit's "
                         f"FP8 kernels compute, TE's default")


def _fp8_format(recipe, allowed):
    if recipe.fp8_format not in allowed:
        _unsupported(recipe, "fp8_format", recipe.fp8_format,
                     " or ".join(f"Format.{f.name}" for f in allowed))
    return "e4m3" if recipe.fp8_format == Format.E4M3 else "hybrid"


@dataclasses.dataclass(eq=False)
class Float8CurrentScaling(Recipe):
    """TE's Float8CurrentScaling: one fp32 scale per expert (group) from its current amax.
    fp8_format HYBRID (e4m3 x, W; e5m2 dy) or E4M3. use_power_2_scales, amax_epsilon: TE's
    QParams fields (one value for every operand in moekit). margin: moekit's (scale =
    fp8_max / amax / 2^margin), default 0 as TE. fp8_gemm_fprop / dgrad / wgrad: TE's MMParams,
    TE's defaults only (fprop fast, dgrad and wgrad with the split accumulator)."""
    fp8_format: Format = Format.HYBRID
    use_power_2_scales: bool = False
    amax_epsilon: float = 0.0
    margin: int = 0
    fp8_gemm_fprop: MMParams = dataclasses.field(default_factory=lambda: MMParams(False))
    fp8_gemm_dgrad: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_gemm_wgrad: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = None
    _name = "fp8-current"

    def _check(self):
        self._check_common()
        _fp8_format(self, (Format.HYBRID, Format.E4M3))
        _check_gemms(self, fprop_split=False)

    def _cpp_args(self):
        return dict(fp8_format=_fp8_format(self, (Format.HYBRID, Format.E4M3)),
                    power_2_scales=bool(self.use_power_2_scales),
                    amax_epsilon=float(self.amax_epsilon), margin=int(self.margin))


@dataclasses.dataclass(eq=False)
class Float8BlockScaling(Recipe):
    """TE's Float8BlockScaling (DeepSeek-V3's): x and dy in 1×128 blocks, W in 128×128 blocks,
    fp32 scales, power-of-two by default. Other block dimensions are not supported.
    fp8_gemm_fprop / dgrad / wgrad: TE's MMParams, split accumulation (TE requires it too)."""
    fp8_format: Format = Format.E4M3
    use_power_2_scales: bool = True
    amax_epsilon: float = 0.0
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_gemm_dgrad: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_gemm_wgrad: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = None
    _name = "fp8-block"

    def _check(self):
        self._check_common()
        _fp8_format(self, (Format.E4M3, Format.HYBRID))
        _check_gemms(self, fprop_split=True)
        for field, want in (("x_block_scaling_dim", 1), ("w_block_scaling_dim", 2),
                            ("grad_block_scaling_dim", 1)):
            if getattr(self, field) != want:
                _unsupported(self, field, getattr(self, field), f"{want} (TE's default)")

    def _cpp_args(self):
        return dict(fp8_format=_fp8_format(self, (Format.E4M3, Format.HYBRID)),
                    power_2_scales=bool(self.use_power_2_scales),
                    amax_epsilon=float(self.amax_epsilon))


@dataclasses.dataclass(eq=False)
class MXFP8BlockScaling(Recipe):
    """TE's MXFP8BlockScaling: e4m3 data, one e8m0 (power-of-two) scale per 32 elements."""
    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = None
    _name = "mxfp8"

    def _check(self):
        self._check_common()
        _fp8_format(self, (Format.E4M3,))
        if self.margin != 0:
            _unsupported(self, "margin", self.margin, "0")

    def _cpp_args(self):
        return dict(fp8_format="e4m3")


@dataclasses.dataclass(eq=False)
class NVFP4BlockScaling(Recipe):
    """TE's NVFP4BlockScaling: e2m1 data, an e4m3 scale per 16 elements and an fp32 scale per
    expert. moekit has no random Hadamard transform, stochastic rounding or 2-D weight blocks:
    the disable_* fields default to True (TE's default False is a ValueError)."""
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    disable_rht: bool = True
    disable_stochastic_rounding: bool = True
    disable_2d_quantization: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = None
    _name = "nvfp4"

    def _check(self):
        self._check_common()
        if self.fp4_format != Format.E2M1:
            _unsupported(self, "fp4_format", self.fp4_format, "Format.E2M1")
        _fp8_format(self, (Format.E4M3,))
        for field in ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization"):
            if not getattr(self, field):
                _unsupported(self, field, False, "True: moekit does not have it yet")

    def _cpp_args(self):
        return dict(fp8_format="e4m3")


_TE_ONLY = ("DelayedScaling", "CustomRecipe")
_state = threading.local()


def _stack() -> list:
    s = getattr(_state, "stack", None)
    if s is None:
        s = _state.stack = []
    return s


def _check_recipe(recipe, argument):
    if recipe is None:
        raise ValueError(f"moekit: autocast(enabled=True) needs {argument}= (moekit has no "
                         "DelayedScaling, TE's default): pass Float8CurrentScaling(), "
                         "Float8BlockScaling(), MXFP8BlockScaling() or NVFP4BlockScaling()")
    if not isinstance(recipe, Recipe):
        name = type(recipe).__name__
        if name in _TE_ONLY:
            raise NotImplementedError(f"moekit: recipe {name} is not supported by moekit "
                                      "(Float8CurrentScaling, Float8BlockScaling, "
                                      "MXFP8BlockScaling, NVFP4BlockScaling are)")
        raise TypeError(f"moekit: {argument} must be a moekit.torch.recipe recipe, got {name}")
    recipe._check()
    recipe.to_moekit()
    return recipe


@contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Recipe | None = None,
             amax_reduction_group=None):
    """TE's te.pytorch.autocast: moekit modules called inside run their GEMMs with `recipe`.
    enabled=False turns quantization off inside (nested contexts: the innermost wins). The
    recipe is read at forward; backward uses the forward's. calibrating and an
    amax_reduction_group are not supported (ValueError)."""
    if calibrating:
        raise ValueError("moekit: autocast(calibrating=True) is not supported by moekit")
    if amax_reduction_group is not None:
        raise ValueError("moekit: autocast(amax_reduction_group=...) is not supported by moekit "
                         "(amaxes are per expert on this rank)")
    if enabled:
        recipe = _check_recipe(recipe, "recipe")
    _stack().append(recipe if enabled else None)
    try:
        yield
    finally:
        _stack().pop()


def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Recipe | None = None,
                 fp8_group=None, _graph: bool = False):
    """TE's older name: fp8_autocast(enabled, calibrating, fp8_recipe, fp8_group)."""
    return autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe,
                    amax_reduction_group=fp8_group)


def active_recipe() -> Recipe | None:
    """The recipe of the innermost autocast (None: outside one, or enabled=False)."""
    s = _stack()
    return s[-1] if s else None


def is_autocast_enabled() -> bool:
    return active_recipe() is not None
