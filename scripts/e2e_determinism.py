"""A target prompt alone vs among 31 others in a real vLLM engine, per arm (GPU evidence).

Usage, on the GPU machine (the project root on PYTHONPATH, e.g. the engine bundle):
    source .device-engine/enter.sh && python scripts/e2e_determinism.py --out $OUT/e2e.json
    python scripts/e2e_determinism.py --out e2e_a.json --models qwen3_next --settings eager
    python scripts/e2e_determinism.py --out e2e.json --merge e2e_a.json e2e_b.json

Every case starts its own engine in a subprocess; vLLM's processes load the plugin through a
generated dist-info on PYTHONPATH (see gdn_evidence/e2e/plugin_site.py), so the package
need not be installed. The JSON is rewritten after every case. See
gdn_evidence/e2e/determinism.py for the arms, settings and JSON fields.
"""

import sys

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.e2e.determinism import main

if __name__ == "__main__":
    sys.exit(main())
