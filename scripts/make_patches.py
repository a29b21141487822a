"""Write ``vllm-diffs/vllm-<version>/qwen_gdn_linear_attn.patch`` for every supported version.

Usage: ``python scripts/make_patches.py [--wheels DIR]``. Each diff is computed from the
pristine file inside that version's published wheel (downloaded with ``pip download
--no-deps`` into DIR when missing) and the plugin's own routing source
(:mod:`vllm_gdn_invariant.patches.diffs`). ``tests/routing/test_patch_files.py`` checks that
the committed files equal what this script writes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

from checkout import REPO_ROOT

from vllm_gdn_invariant.patches.diffs import MODULE_PATH, PATCH_FILE_NAME, unified_diff
from vllm_gdn_invariant.plugin.versions import FINGERPRINTS

DIFFS_FOLDER = "vllm-diffs"
DEFAULT_WHEELS = Path.home() / ".cache" / "vllm-gdn-invariant" / "wheels"


def pristine_source(version: str, wheels: Path) -> str:
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                f"vllm=={version}",
                "-d",
                str(wheels),
            ],
            check=True,
        )
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    with zipfile.ZipFile(found[0]) as wheel:
        return wheel.read(MODULE_PATH).decode("utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS)
    args = parser.parse_args()
    for version in sorted({v for d, v in FINGERPRINTS if d == "vllm"}):
        out = REPO_ROOT / DIFFS_FOLDER / f"vllm-{version}" / PATCH_FILE_NAME
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(unified_diff(pristine_source(version, args.wheels)), encoding="utf-8")
        print(f"wrote {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
