"""What the shadow checker reports on a GPU with vLLM's real kernels, as JSON with provenance.

    python scripts/shadow_gpu_check.py --out shadow_gpu.json [--layouts tp1,tp4]

For each head layout, recurrent state dtype and composition (a decode-only step of 4 rows,
then the mixed compositions of harness/mixed_step.py), and each arm:

* ``routed``: the routing patch under the shadow wrappers (mode route);
* ``routing off``: the shadow wrappers over vLLM's own ``_forward_core`` (mode off);
* ``mode golden``: the routing patch and mode golden's patches (golden-matched kernels),

one step runs with the checker off and on (rate 1.0, references golden and decode, no caps);
the report gives, per record, the provider, the rows, and per field the elements differing,
compared, max ULP and the ULP histogram, and whether every served bit was the same with the
checker on. Expected (tests/gpu/test_shadow_gpu.py): reference decode 0 on decode-only and
routed steps and > 0 (fp32) on vLLM's mixed path; reference golden the provider-agreement
distance (scripts/provider_agreement.py: fp32 recurrent state differs, conv state equal) and
0 under mode golden. Exit status 0 when written, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.layer import LAYOUTS, STATE_DTYPES, make_vllm_config
from gdn_evidence.harness.mixed_step import COMPOSITIONS, Composition
from gdn_evidence.harness.provenance import provenance
from gdn_evidence.harness.shadow_case import (
    FIELDS,
    field_summary,
    installed,
    shadow_case,
)

SCHEMA = "vllm-gdn-invariant/shadow-gpu-check/1"
ARMS = {"routed": (True, False, "route"), "routing off": (False, False, "off")}
ARMS["mode golden"] = (True, True, "golden")
CASES = [Composition(4, (), False), *COMPOSITIONS]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"from {sorted(LAYOUTS)}")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"from {list(ARMS)}")
    parser.add_argument("--cases", type=int, default=len(CASES), help="first N compositions")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("shadow_gpu_check: needs CUDA", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    rows = []
    print(
        f"{'arm':<12} {'heads':<5} {'state':<9} {'case':<22} {'ref':<7} {'provider':<19} "
        f"{'rows':>4}  differing out/state/conv  max ULP out/state/conv  unchanged"
    )
    for layout in args.layouts.split(","):
        dims = LAYOUTS[layout]
        for dtype_name, state_dtype in STATE_DTYPES.items():
            vllm_config = make_vllm_config(dims, state_dtype)
            for arm in args.arms.split(","):
                routed, golden_mode, mode = ARMS[arm]
                with installed(routed, golden_mode):
                    for seed, composition in enumerate(CASES[: args.cases]):
                        case = shadow_case(
                            vllm_config,
                            dims,
                            state_dtype,
                            composition,
                            device=device,
                            mode=mode,
                            seed=seed,
                        )
                        for record in case["records"]:
                            summary = field_summary(record)
                            rows.append(
                                {
                                    "arm": arm,
                                    "layout": layout,
                                    "state_dtype": dtype_name,
                                    "decodes": case["decodes"],
                                    "prefills": case["prefills"],
                                    "step_kind": record["step_kind"],
                                    "reference": record["reference"],
                                    "provider": record["provider"],
                                    "rows": record["rows"],
                                    "served_bits_unchanged": case["served_bits_unchanged"],
                                    "failures": case["failures"],
                                    "fields": summary,
                                }
                            )
                            name = (
                                f"{case['decodes']}+{','.join(map(str, case['prefills'])) or '-'}"
                            )
                            print(
                                f"{arm:<12} {layout:<5} {dtype_name:<9} {name:<22} "
                                f"{record['reference']:<7} {record['provider']:<19} "
                                f"{record['rows']:>4}  "
                                + "/".join(str(summary[f]["differing"]) for f in FIELDS).ljust(26)
                                + "/".join(str(summary[f]["max_ulp"]) for f in FIELDS).ljust(24)
                                + f"{case['served_bits_unchanged']}",
                                flush=True,
                            )
                        args.out.write_text(
                            json.dumps(
                                {"schema": SCHEMA, "provenance": provenance(), "records": rows},
                                indent=1,
                            )
                        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
