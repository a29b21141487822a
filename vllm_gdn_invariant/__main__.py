"""``python -m vllm_gdn_invariant {doctor,demo}``."""

from __future__ import annotations

import sys

from vllm_gdn_invariant.cli import demo, doctor

COMMANDS = {"doctor": doctor.main, "demo": demo.main}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print("usage: python -m vllm_gdn_invariant {doctor,demo} [options]", file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
