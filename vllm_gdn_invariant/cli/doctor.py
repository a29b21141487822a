"""``python -m vllm_gdn_invariant doctor``: what the plugin would do here, and why.

Prints the installed vLLM build, the platform, the parsed configuration and every function
the plugin replaces or relies on with its fingerprint status. Exits 0 when the plugin would
patch (or is off), 1 when it would refuse, 2 when its configuration is invalid.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

from vllm_gdn_invariant.plugin.config import ConfigError, load_config
from vllm_gdn_invariant.plugin.entry import plan
from vllm_gdn_invariant.plugin.versions import supported_builds

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "gdn_invariant"


def entry_point_line() -> str:
    found = [
        ep
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.name == ENTRY_POINT_NAME
    ]
    if not found:
        return f"{ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} NOT FOUND (is the package installed?)"
    return f"{ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} -> {found[0].value}"


def plugins_env_line() -> str:
    value = os.environ.get("VLLM_PLUGINS")
    if value is None:
        return "unset (vLLM loads every installed plugin, this one included)"
    if ENTRY_POINT_NAME in value.split(","):
        return f"{value!r} (loads gdn_invariant)"
    return f"{value!r} (does NOT load gdn_invariant; add it to the list)"


def platform_line() -> str:
    import torch

    try:
        from vllm.platforms import current_platform

        name = f"{type(current_platform).__name__} ({current_platform.device_name})"
    except Exception as exc:  # noqa: BLE001 - doctor reports, it does not fail here
        name = f"unavailable ({exc.__class__.__name__}: {exc})"
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    return f"{name}; torch {torch.__version__}; {cuda}"


def main(argv: list[str] | None = None) -> int:
    try:
        from vllm_gdn_invariant import __version__
    except ImportError:
        __version__ = "unknown"
    print(f"vllm-gdn-invariant {__version__} doctor")
    print(f"entry point:  {entry_point_line()}")
    print(f"VLLM_PLUGINS: {plugins_env_line()}")
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"config:       INVALID: {exc}")
        print("verdict:      the plugin would raise at load and patch nothing")
        return 2
    print(f"config:       {config.describe()}")
    status = plan(config)
    guard = status.guard
    build = "not checked (mode off)"
    if guard is not None:
        build = "not installed" if guard.installed is None else guard.installed.describe()
    print(f"vLLM:         {build}")
    print(f"supported:    {', '.join(supported_builds())}")
    print(f"platform:     {platform_line()}")
    if guard is not None and guard.checks:
        print("targets:")
        width = max(len(c.target.qualname) for c in guard.checks)
        for check in guard.checks:
            print(
                f"  {check.role:<10} {check.target.qualname:<{width}}  "
                f"expected {check.expected or '-':<16}  found {check.found or '-':<16}  "
                f"{check.state.value}"
            )
    if status.refusal is not None:
        consequence = "raise at startup (strict)" if config.strict else "patch nothing"
        print(f"verdict:      REFUSE ({consequence}): {status.refusal}")
        return 1
    print(f"verdict:      {status.action()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
