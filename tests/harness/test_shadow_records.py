"""group_checks sums check records by what was checked against what."""

from __future__ import annotations

from gdn_evidence.harness.shadow_records import group_checks


def check(layer, provider="routed", impl="golden-kernels", state_ulp=0, step_kind="mixed"):
    def field(ulp):
        return {"differing": int(ulp > 0), "max_ulp": ulp}

    record = {
        "kind": "check",
        "layer": f"model.layers.{layer}.linear_attn",
        "reference": "golden",
        "provider": provider,
        "step_kind": step_kind,
        "state_dtype": "bfloat16",
        "output": field(0),
        "recurrent_state": field(state_ulp),
        "conv_state": field(0),
    }
    if impl is not None:
        record["reference_impl"] = impl
    return record


def test_checks_are_summed_per_provider_impl_and_step_kind():
    records = [
        check(0, state_ulp=3),
        check(1, state_ulp=40),
        check(1),
        check(0, provider="vllm-packed-decode", step_kind="decode", state_ulp=7),
        check(0, impl=None),  # a record from before reference_impl
        {"kind": "failure", "stage": "compare", "error": "x"},
    ]
    groups = {(g["provider"], g["reference_impl"]): g for g in group_checks(records)}
    assert set(groups) == {
        ("routed", "golden-kernels"),
        ("vllm-packed-decode", "golden-kernels"),
        ("routed", None),
    }
    routed = groups[("routed", "golden-kernels")]
    assert (routed["checks"], routed["layers"]) == (3, 2)
    assert routed["checks_with_difference"] == {"output": 0, "recurrent_state": 2, "conv_state": 0}
    assert routed["max_ulp"]["recurrent_state"] == 40
    assert groups[("vllm-packed-decode", "golden-kernels")]["max_ulp"]["recurrent_state"] == 7
    assert groups[("routed", None)]["checks"] == 1
    assert [g["provider"] for g in group_checks(records)] == [
        "routed",
        "routed",
        "vllm-packed-decode",
    ]
