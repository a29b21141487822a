"""Preempted requests keep their bits: forced and natural preemption in a real vLLM engine.

Usage, on the GPU machine (the project root on PYTHONPATH, e.g. the engine bundle):
    source .device-engine/enter.sh && python scripts/preemption_determinism.py --out $OUT/p.json
    python scripts/preemption_determinism.py --out p.json --models qwen3_next --graphs eager

On vLLM's CPU build (a smoke run of the protocol: the CPU build refuses batch-invariant mode
for Qwen3-Next and runs GDN layers through forward_cpu, so nothing is replayed there):
    python scripts/preemption_determinism.py --out /tmp/p.json --models qwen3_next \\
        --graphs eager --modes golden --no-batch-invariant --attention-backend '' \\
        --prefill-backend ''

Every (model, CUDA graphs, mode) runs one engine in its own process, several at a time; see
gdn_evidence/e2e/preemption.py for the cases, the arms and the JSON fields.
"""

import sys

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.e2e.preemption import main

if __name__ == "__main__":
    sys.exit(main())
