"""The installed entry point, and vLLM's own plugin loader calling it (or not)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

LOADER_PROBE = """
import json
from vllm.plugins import load_general_plugins
from vllm_gdn_invariant.plugin import entry
load_general_plugins()
status = entry.registered_status()
print("RESULT " + json.dumps({"called": status is not None,
                              "applied": bool(status and status.applied)}))
"""


def test_entry_point_is_installed_in_vllms_group():
    (ep,) = [
        ep
        for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
        if ep.name == "gdn_invariant"
    ]
    assert ep.value == "vllm_gdn_invariant.plugin.entry:register"
    from vllm_gdn_invariant.plugin.entry import register

    assert ep.load() is register


@pytest.mark.parametrize(
    "plugins, called", [("gdn_invariant", True), ("other", False), ("other,gdn_invariant", True)]
)
def test_vllms_loader_calls_register_only_when_named(plugins, called):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    env["VLLM_PLUGINS"] = plugins
    proc = subprocess.run(
        [sys.executable, "-c", LOADER_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result == {"called": called, "applied": called}
