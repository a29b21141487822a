"""The gated RMSNorm after the GDN core launches one row per program under batch-invariant
mode, whatever the number of rows: vLLM's real launchers, the Triton kernel replaced by a
recorder of what it would be launched with."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from vllm.third_party.flash_linear_attention.ops import layernorm_guard

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_gated_norm import (
    QWEN3_5_GATED_NORM_MODULE,
    gated_norm_patches,
)

SMS = 132  # H100/H200
HEAD_V_DIM = 128
ROWS = [1, 8, 264, 500, 40000]  # tokens x value heads of a step


class Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` records the launch."""

    def __init__(self) -> None:
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append({"grid": tuple(grid), **kwargs})

        return launch


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


HAS_QWEN3_5_FUSED_NORM = module_exists(QWEN3_5_GATED_NORM_MODULE)


@pytest.fixture(autouse=True)
def sms(monkeypatch):
    monkeypatch.setattr(layernorm_guard, "num_compute_units", lambda index=None: SMS)
    if not hasattr(layernorm_guard.triton, "next_power_of_2"):  # vLLM's CPU build: placeholder
        import triton

        monkeypatch.setattr(layernorm_guard, "triton", triton)


@pytest.fixture
def recorder(monkeypatch):
    recorder = Recorder()
    if hasattr(layernorm_guard, "LayerNormFwdKernel"):  # vLLM 0.30+
        monkeypatch.setattr(layernorm_guard.LayerNormFwdKernel, "kernel", recorder)
    else:
        monkeypatch.setattr(layernorm_guard, "layer_norm_fwd_kernel", recorder)
    return recorder


@pytest.fixture
def patched():
    # the Qwen3.5 binding where its module imports (vLLM 0.34; its package needs torchvision)
    patches = [p for p in gated_norm_patches() if p.binding is None or HAS_QWEN3_5_FUSED_NORM]
    with applied(patches):
        yield


def launch_rows_per_block(recorder, rows: int) -> int:
    x = torch.zeros(rows, HEAD_V_DIM, dtype=torch.bfloat16)
    z = torch.zeros_like(x)
    weight = torch.ones(HEAD_V_DIM, dtype=torch.bfloat16)
    layernorm_guard.rmsnorm_fn(x, weight, None, z=z, eps=1e-6, norm_before_gate=False)
    launch = recorder.launches[-1]
    assert launch["grid"][0] == -(-rows // launch["ROWS_PER_BLOCK"])
    return launch["ROWS_PER_BLOCK"]


def test_vllm_alone_picks_the_tile_from_the_number_of_rows(recorder):
    tiles = [launch_rows_per_block(recorder, rows) for rows in ROWS]
    assert tiles == [1, 1, 1, 2, 4]  # negative control


def test_one_row_per_program_with_the_plugin(recorder, patched):
    assert [launch_rows_per_block(recorder, rows) for rows in ROWS] == [1] * len(ROWS)


def test_the_plugin_keeps_vllms_tile_where_vllm_picks_one_row(recorder, patched):
    # Up to 2 * SMs rows (every decode step of up to 2 * SMs / num_v_heads requests).
    assert layernorm_guard.calc_rows_per_block(2 * SMS, torch.device("cpu")) == 1


if HAS_QWEN3_5_FUSED_NORM:  # vLLM 0.34: Qwen3.5's fused gated norm imports the same function

    def test_qwen3_5_fused_gated_norm_keeps_one_row_per_program(monkeypatch, patched):
        fused = importlib.import_module(QWEN3_5_GATED_NORM_MODULE)
        recorder = Recorder()
        monkeypatch.setattr(fused, "_fused_gdn_gated_rms_norm_kernel", recorder)
        heads = 4
        for tokens in (1, 10000):
            x = torch.zeros(tokens, heads * HEAD_V_DIM, dtype=torch.bfloat16)
            fused.fused_gdn_gated_rms_norm(
                x=x,
                z=torch.zeros_like(x),
                weight=torch.ones(HEAD_V_DIM, dtype=torch.bfloat16),
                out=torch.empty_like(x),
                eps=1e-6,
                num_v_heads=heads,
                head_v_dim=HEAD_V_DIM,
                norm_before_gate=False,
                activation="silu",
            )
        assert [launch["ROWS_PER_BLOCK"] for launch in recorder.launches] == [1, 1]
