"""CPU checks of harness/agreement.py and scripts/provider_agreement.py: cases, report shape.

vLLM's kernels need CUDA; here they are replaced by stand-ins with the same call signature
that run the golden (or the golden plus a known perturbation) in place.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdn_evidence.harness.agreement import (
    SCHEMA,
    Providers,
    build_report,
    import_first,
    run_conv_case,
    run_recurrent_case,
    untouched_equal,
)
from gdn_evidence.harness.layer import LayerDims
from vllm_gdn_invariant.golden import conv_update, recurrent_step

from .helpers import next_up

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "provider_agreement.py"
SMALL = LayerDims(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32)
CPU = torch.device("cpu")


def golden_packed_decode(perturb: bool = False):
    """A stand-in with vLLM's packed-decode signature: the golden, written in place."""

    def packed_decode(
        *,
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        scale,
        initial_state,
        out,
        ssm_state_indices,
        use_qk_l2norm_in_kernel,
    ):
        HV, V, K = initial_state.shape[1:]
        H = (mixed_qkv.shape[1] - HV * V) // (2 * K)
        o, state = recurrent_step(
            mixed_qkv,
            a,
            b,
            A_log,
            dt_bias,
            initial_state,
            ssm_state_indices,
            num_k_heads=H,
            scale=scale,
            use_qk_l2norm=use_qk_l2norm_in_kernel,
        )
        out.copy_(o)
        initial_state.copy_(state)
        if perturb:  # one state element one ULP up
            block = int(ssm_state_indices[ssm_state_indices > 0][0])
            initial_state[block, 0, 0, 0] = next_up(initial_state[block, 0, 0, 0])
        return out, initial_state

    return packed_decode


def golden_causal_conv1d_update(
    x, conv_state, weight, bias=None, activation=None, conv_state_indices=None, **_
):
    """A stand-in with vLLM's signature: in place on conv_state, inactive rows not written."""
    out, state = conv_update(
        x, conv_state, weight, conv_state_indices, bias=bias, activation=activation
    )
    conv_state.copy_(state)
    rows = conv_state_indices > 0
    x[rows] = out[rows]
    return x


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_recurrent_case_of_an_exact_provider_reports_no_difference(state_dtype):
    case = run_recurrent_case(golden_packed_decode(), "small", SMALL, 17, state_dtype, 1, CPU)
    assert case["out"]["elements_differing"] == 0
    assert case["state"]["elements_differing"] == 0
    assert case["state"]["total_elements"] == 15 * 4 * 32 * 32  # rows 1 and 8 inactive
    assert case["inactive_rows"] == [1, 8]
    assert case["untouched_blocks_equal"] == {"golden": True, "provider": True}


def test_recurrent_case_reports_a_one_ulp_state_difference():
    provider = golden_packed_decode(perturb=True)
    case = run_recurrent_case(provider, "small", SMALL, 4, torch.float32, 2, CPU)
    assert case["state"]["elements_differing"] == 1
    assert case["state"]["ulp_histogram"]["1"] == 1
    assert case["state"]["ulp_histogram"]["0"] == case["state"]["total_elements"] - 1
    assert case["out"]["elements_differing"] == 0


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_conv_case_of_an_exact_provider_reports_no_difference(cache_dtype):
    case = run_conv_case(golden_causal_conv1d_update, "small", SMALL, 17, cache_dtype, 3, CPU)
    assert case["out_active_rows"]["elements_differing"] == 0
    assert case["out_active_rows"]["total_elements"] == 15 * SMALL.conv_dim
    assert case["state"]["elements_differing"] == 0
    assert case["untouched_blocks_equal"] == {"golden": True, "provider": True}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_negative_zero_written_into_an_untouched_block_is_a_write(dtype):
    before = torch.zeros(4, 2, 3, dtype=dtype)  # blocks 0 (null) and 2 untouched, all +0
    before[1].normal_()
    before[3].normal_()
    indices = torch.tensor([1, 3, 0])
    after = before.clone()
    after[1] += 1  # the active blocks may change
    after[3] *= 2
    assert untouched_equal(before, after, indices)
    after[2, 0, 1] = -0.0
    assert not untouched_equal(before, after, indices)


def test_report_is_strict_json_with_provenance():
    providers = Providers(
        golden_packed_decode(), golden_causal_conv1d_update, "stand-in", "stand-in"
    )
    report = build_report(providers, {"small": SMALL}, [1, 4], 0, CPU)
    text = json.dumps(report, allow_nan=False)
    assert json.loads(text)["schema"] == SCHEMA
    assert len(report["recurrent"]) == len(report["conv"]) == 4
    provenance = report["provenance"]
    for key in (
        "git_commit",
        "git_dirty",
        "vllm",
        "torch",
        "torch_cuda",
        "triton",
        "device",
        "capability",
        "python",
        "platform",
        "timestamp",
        "argv",
        "golden_module",
        "recurrent_provider",
        "conv_provider",
    ):
        assert key in provenance
    assert set(provenance["env"]) == {
        "FLA_USE_FAST_OPS",
        "TRITON_DEFAULT_FP_FUSION",
        "VLLM_BATCH_INVARIANT",
        "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE",
        "VLLM_GDN_DECODE_KERNEL",
        "VLLM_SSM_CONV_STATE_LAYOUT",
    }


def test_script_without_cuda_exits_with_status_2_and_writes_nothing(tmp_path):
    target = tmp_path / "agreement.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(target)],
        cwd=REPO_ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # torch sees no GPU
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "CUDA is not available" in result.stderr  # not argparse's exit status 2
    assert not target.exists()


def test_import_first_skips_missing_modules_but_not_broken_ones(monkeypatch, tmp_path):
    assert import_first(("json.no_such_module", "json")).__name__ == "json"
    (tmp_path / "broken_provider_module.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        import_first(("broken_provider_module", "json"))
