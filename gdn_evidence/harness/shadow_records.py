"""Shadow check records summed by what was checked against what (evidence scripts).

:func:`group_checks` sums the check records of one or more JSONL files (shadow/record.py) by
reference, what computed it, provider, step kind and state dtype: checks, layers, and per
field the checks with a difference and the largest ULP distance.
"""

from __future__ import annotations

from typing import Any

from vllm_gdn_invariant.shadow.record import FIELDS


def group_checks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (reference, provider, step kind, state dtype, reference impl), sorted;
    records that are not checks are skipped."""
    groups: dict[tuple, dict[str, Any]] = {}
    layers: dict[tuple, set[str]] = {}
    for r in records:
        if r["kind"] != "check":
            continue
        key = (
            r["reference"],
            r["provider"],
            r["step_kind"],
            r["state_dtype"],
            r.get("reference_impl"),  # absent from records written before it existed
        )
        g = groups.setdefault(
            key,
            {
                "reference": key[0],
                "provider": key[1],
                "step_kind": key[2],
                "state_dtype": key[3],
                "reference_impl": key[4],
                "checks": 0,
                "checks_with_difference": dict.fromkeys(FIELDS, 0),
                "max_ulp": dict.fromkeys(FIELDS, 0),
            },
        )
        g["checks"] += 1
        layers.setdefault(key, set()).add(r["layer"])
        for name in FIELDS:
            g["checks_with_difference"][name] += r[name]["differing"] > 0
            g["max_ulp"][name] = max(g["max_ulp"][name], r[name]["max_ulp"])
    for key, g in groups.items():
        g["layers"] = len(layers[key])
    return sorted(groups.values(), key=lambda g: (g["reference"], g["provider"], g["step_kind"]))
