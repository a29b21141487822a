"""The installed ``vllm-gdn-invariant`` console script and ``python -m vllm_gdn_invariant``.

Help and usage errors come from the parser alone, so these subprocesses do not import vLLM.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

SCRIPT = Path(sys.executable).with_name("vllm-gdn-invariant")
ENTRY_POINTS = {
    "console script": ([str(SCRIPT)], "vllm-gdn-invariant"),
    "python -m": ([sys.executable, "-m", "vllm_gdn_invariant"], "python -m vllm_gdn_invariant"),
}


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_help_exits_0_with_usage_for_the_top_level_and_both_subcommands(entry):
    command, prog = ENTRY_POINTS[entry]
    if entry == "console script":
        assert SCRIPT.exists(), f"{SCRIPT} is not installed (pip install -e .)"
    for argv, usage in (
        (["--help"], f"usage: {prog} [-h] {{doctor,demo,report}}"),
        (["doctor", "--help"], f"usage: {prog} doctor [-h] [--model DIR"),
        (["demo", "--help"], f"usage: {prog} demo [-h]"),
    ):
        proc = run([*command, *argv])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(usage), proc.stdout[:300]


def test_console_script_usage_errors_exit_2_with_the_message_on_stderr():
    proc = run([str(SCRIPT), "doctor", "--bogus"])
    assert proc.returncode == 2
    assert "vllm-gdn-invariant doctor: error: unrecognized arguments: --bogus" in proc.stderr
    proc = run([str(SCRIPT)])
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: vllm-gdn-invariant")


def test_help_and_usage_errors_do_not_import_vllm():
    code = (
        "import sys\n"
        "from vllm_gdn_invariant.cli import main\n"
        "for argv in (['--help'], ['doctor', '--help'], ['demo', '--help'], ['doctor', '-x']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('VLLM IMPORTED' if 'vllm' in sys.modules else 'NO VLLM')\n"
    )
    proc = run([sys.executable, "-c", code])
    assert proc.stdout.strip().splitlines()[-1] == "NO VLLM", proc.stdout[-500:]
