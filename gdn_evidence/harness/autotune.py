"""Which config each autotuned Triton kernel settled on in this process.

Triton autotunes a kernel on its first launch per key and keeps that config for the process;
evidence that depends on a kernel's arithmetic names the configs it ran with.
"""

from __future__ import annotations

import sys

FLA_OPS = "vllm.third_party.flash_linear_attention.ops."


def autotuned_configs(prefix: str = FLA_OPS) -> dict[str, str]:
    """``{"module.kernel": config}`` for the autotuned kernels of the loaded modules under
    ``prefix`` that have been launched (vLLM's FLA ops by default)."""
    from triton.runtime.autotuner import Autotuner

    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix):
            continue
        for attr, value in vars(module).items():
            while type(value).__module__ == "triton.runtime.autotuner" and not isinstance(
                value, Autotuner
            ):
                value = value.fn  # heuristics wrap the autotuner
            if isinstance(value, Autotuner) and getattr(value, "best_config", None):
                found[f"{name.rsplit('.', 1)[-1]}.{attr}"] = str(value.best_config)
    return found
