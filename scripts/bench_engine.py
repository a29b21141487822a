"""Throughput and inter-token latency: vLLM alone, the plugin, the plugin with
VLLM_BATCH_INVARIANT=1, three engines side by side, arms alternating (GPU evidence).

Usage, on the GPU machine (the project root on PYTHONPATH, e.g. the engine bundle):
    source .device-engine/enter.sh && python scripts/bench_engine.py --out $OUT/bench.json

See gdn_evidence/e2e/bench.py for the model, the workloads and the JSON fields.
"""

import sys

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.e2e.bench import main

if __name__ == "__main__":
    sys.exit(main())
