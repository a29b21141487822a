"""The engine evidence of the response replay: every GDN layer of vLLM's engine (mode golden,
``VLLM_BATCH_INVARIANT=1``, eager) captured and replayed bit for bit, with a control.

Usage, on the GPU machine (the project root on PYTHONPATH, e.g. the engine bundle):
    source .device-engine/enter.sh && python scripts/replay_engine_check.py --out $OUT/r.json
    python scripts/replay_engine_check.py --table docs/evidence/replay_engine.json
On the CPU, the synthetic engine through the same records and comparison (CI):
    python scripts/replay_engine_check.py --smoke --out /tmp/replay_smoke.json

One engine per model, in its own process; see gdn_evidence/e2e/replay_engine.py for the
workload, the capture, the cases and the JSON fields.
"""

import sys

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.e2e.replay_engine import main

if __name__ == "__main__":
    sys.exit(main())
