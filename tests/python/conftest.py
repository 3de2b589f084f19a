"""Shared fixtures of the Python tests. torch and numpy are required: a missing one is a
collection error (a failure), never a skip — CI installs them (.ci/run)."""
import pytest
import torch

import moekit

# CUDA cases run when torch sees a GPU. On such a machine a moekit built without CUDA fails
# them (moekit.torch raises NotImplementedError): they are never skipped there.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# Tolerances against an fp64 torch reference, by dtype: loose enough for fp32 accumulation and
# one rounding into the dtype at the data's scale (unit-normal data, K <= 128), tight enough that
# a single wrong element (a wrong group's weight, a missing term) fails.
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=3e-2),
       torch.float16: dict(rtol=3e-3, atol=3e-3)}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def assert_close(actual, expected, dtype, scale=1.0):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol["rtol"],
                               atol=tol["atol"] * scale)


def built_for(device: str):
    """A CUDA case on a GPU machine needs moekit's CUDA path: fail (not skip) without it."""
    if device == "cuda":
        assert moekit.built_with_cuda(), (
            "this machine has a GPU but moekit was built without CUDA (MOEKIT_WITH_CUDA=OFF or "
            "no nvcc): the CUDA path is missing")
