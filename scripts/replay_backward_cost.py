"""What replay_response's backward costs on the CPU, in time and memory, for a few sizes.

    python scripts/replay_backward_cost.py [--sizes 1x64 1x256 1x1024 4x256] [--json FILE]

Each size SxT is S sequences of T tokens at Qwen3-Next's per-rank dims under tensor parallel 4
(H=4, HV=8, K=V=128, W=4), bf16 x, a float32 state. Each size runs in its own process, which
first runs a 4-token replay and its backward (so that the one-time costs of the ops' first use,
about 150 MiB of resident memory here, fall outside the measurement), then times the forward
(the goldens, one batched step per token), then the backward (the float32 recomputation in
checkpointed segments and its backpropagation; recurrence.py), and reads its peak resident
memory (``ru_maxrss``) after each, with glibc's mmap threshold at 64 KiB so that freed
tensors leave the resident set. Printed per size: forward and backward
seconds, their ratio, the backward's growth of the peak (MiB) and that growth per token and per
state (a state is HV*V*K*4 bytes = 512 KiB here). The machine's other load shows in the times;
the ratios and the memory are what the docs quote.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.replay import replay_response

H, HV, K, V, W = 4, 8, 128, 128, 4
STATE_BYTES = HV * V * K * 4


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(sequences: int, length: int) -> dict:
    """One size, in this process: seconds and peak memory of the forward and the backward."""
    run(1, 4)
    return run(sequences, length)


def run(sequences: int, length: int) -> dict:
    torch.manual_seed(0)
    n, dim = sequences * length, 2 * H * K + HV * V
    x = torch.randn(n, dim).bfloat16().requires_grad_(True)
    a, b = torch.randn(n, HV).bfloat16(), torch.randn(n, HV).bfloat16()
    A_log, dt_bias = torch.rand(HV).requires_grad_(True), torch.randn(HV)
    conv_weight = (torch.randn(dim, W) * 0.5).bfloat16()
    conv_state = torch.randn(sequences, dim, W - 1).bfloat16()
    state = (torch.randn(sequences, HV, V, K) * 0.1).requires_grad_(True)
    cu_seqlens = torch.arange(sequences + 1, dtype=torch.int32) * length
    before = peak_mib()
    start = time.perf_counter()
    out, _, final = replay_response(
        x, a, b, A_log, dt_bias, conv_weight, conv_state, state, cu_seqlens,
        num_k_heads=H, scale=K**-0.5,
    )  # fmt: skip
    forward_s = time.perf_counter() - start
    after_forward = peak_mib()
    start = time.perf_counter()
    (out.float().square().sum() + final.sum()).backward()
    backward_s = time.perf_counter() - start
    growth = peak_mib() - after_forward
    return {
        "sequences": sequences,
        "tokens_per_sequence": length,
        "forward_s": forward_s,
        "backward_s": backward_s,
        "backward_over_forward": backward_s / forward_s,
        "forward_peak_growth_mib": after_forward - before,
        "backward_peak_growth_mib": growth,
        "backward_growth_states_per_sequence": growth * 2**20 / STATE_BYTES / sequences,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1x64", "1x256", "1x1024", "4x256"])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's size
    args = parser.parse_args()
    if args.one:
        sequences, length = map(int, args.one.split("x"))
        print(json.dumps(measure(sequences, length)))
        return 0
    rows = []
    for size in args.sizes:
        child = subprocess.run(
            [sys.executable, __file__, "--one", size],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
        )
        row = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"S={row['sequences']:2d} T={row['tokens_per_sequence']:5d}  "
            f"forward {row['forward_s']:7.2f} s  backward {row['backward_s']:7.2f} s  "
            f"(x{row['backward_over_forward']:.2f})  backward peak +"
            f"{row['backward_peak_growth_mib']:7.1f} MiB = "
            f"{row['backward_growth_states_per_sequence']:5.1f} states per sequence "
            f"(sqrt(T) = {row['tokens_per_sequence'] ** 0.5:.0f})",
            flush=True,
        )
    if args.json:
        record = {"provenance": provenance(), "dims": dict(H=H, HV=HV, K=K, V=V, W=W), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
