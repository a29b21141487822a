"""``harness.autotune``: the configs autotuned kernels settled on, found through heuristics."""

from __future__ import annotations

import sys
import types

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from gdn_evidence.harness.autotune import autotuned_configs  # noqa: E402


@triton.heuristics({"B": lambda args: 1})
@triton.autotune(configs=[triton.Config({"A": 1}, num_warps=2)], key=["n"])
@triton.jit
def kernel(x, n, A: tl.constexpr, B: tl.constexpr):
    pass


def test_only_launched_kernels_are_named_with_their_config(monkeypatch):
    module = types.ModuleType("fake_ops.kernels")
    module.kernel, module.number = kernel, 3
    monkeypatch.setitem(sys.modules, "fake_ops.kernels", module)
    assert autotuned_configs("fake_ops.") == {}  # not launched: no config yet
    autotuner = kernel.fn  # the heuristics wrap the autotuner
    monkeypatch.setattr(autotuner, "best_config", autotuner.configs[0], raising=False)
    assert autotuned_configs("fake_ops.") == {"kernels.kernel": str(autotuner.configs[0])}
    assert autotuned_configs("other_ops.") == {}
