"""``python -m vllm_gdn_invariant {doctor,demo}`` and the ``vllm-gdn-invariant`` console script."""

from __future__ import annotations

import sys

from vllm_gdn_invariant.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
