"""Real ``vllm serve`` runs (vLLM's OpenAI server, vLLM's CPU build, tiny Qwen3-Next, the
plugin) and the one pair of servers the serve tests share (``served`` in ``conftest.py``).

The pair: route mode with the shadow checker at rate 1.0 (and a failure injected into the
first golden reference call of each process, through a ``sitecustomize`` on the server's
``PYTHONPATH``) beside route mode with it off, both answering the same concurrent completion
requests over loopback; both are stopped once everything the tests read (completions, JSONL
records, ``/metrics``, logs) is collected. An engine start costs ~30-60 s on the CI machine.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from vllm_gdn_invariant.models.tiny import words, write_tiny_model
from vllm_gdn_invariant.shadow.record import read_records

START_TIMEOUT_S = 420
PROMPT_WORDS = (5, 300, 40, 12)  # a 300-word prompt is prefilled in chunks beside decodes
MAX_TOKENS = 10

INJECT = '''
"""Test only: the first golden reference call of each process raises."""
from vllm_gdn_invariant.shadow import reference

_real = reference.golden_reference
_calls = []


def golden_reference(*args, **kwargs):
    _calls.append(1)
    if len(_calls) == 1:
        raise RuntimeError("injected by tests/serving.py")
    return _real(*args, **kwargs)


reference.golden_reference = golden_reference
'''


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
        "--gpu-memory-utilization",  # of RAM on CPU, zeroed at start; engines run side by side
        "0.05",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def plugin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    env.update(VLLM_PLUGINS="gdn_invariant", PYTHONUNBUFFERED="1", **extra)
    return env


def prompts() -> list[str]:
    return [words(n, start=31 * i) for i, n in enumerate(PROMPT_WORDS)]


class Server:
    """One ``vllm serve`` process, its output in ``log``."""

    def __init__(self, model: Path, log: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.model = model
        command = serve_command(model, self.port) + ["--max-num-batched-tokens", "64"]
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_healthy(self, deadline: float) -> None:
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()[-5000:]
            assert time.monotonic() < deadline, "server did not start in time"
            try:
                if requests.get(self.url("/health"), timeout=2).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(1)

    def complete(self, prompt: str) -> dict:
        reply = requests.post(
            self.url("/v1/completions"),
            json={
                "model": str(self.model),
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "ignore_eos": True,
                "logprobs": 1,
            },
            timeout=300,
        )
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        return {"text": choice["text"], "logprobs": choice["logprobs"]["token_logprobs"]}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@dataclass
class Served:
    """What one server answered and wrote: the completions of :func:`prompts`, its shadow
    records and ``/metrics`` (empty with shadow off), its log, the records' folder."""

    completions: list[dict]
    records: list[dict]
    metrics: str
    log: str
    out_dir: Path


def metrics_once_exported(server: Server, checks: int) -> str:
    """/metrics once it counts ``checks`` checks (workers export at most once a second)."""
    deadline = time.monotonic() + 30
    while True:
        text = requests.get(server.url("/metrics"), timeout=10).text
        total = sum(
            float(v)
            for v in re.findall(r"^gdn_invariant_shadow_checks_total\{.*\} (\S+)$", text, re.M)
        )
        if total >= checks or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


def serve_shadow_on_and_off(root: Path) -> dict[str, Served]:
    """Start both servers at once, send both the same concurrent requests, collect, stop."""
    model = write_tiny_model(root / "model")
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INJECT)
    out_dir = root / "shadow"
    out_dir.mkdir()
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    envs = {
        "on": plugin_env(
            VLLM_GDN_INVARIANT_SHADOW=f"1.0,ref=golden+decode,out={out_dir}/shadow.jsonl",
            PYTHONPATH=pythonpath,
        ),
        "off": plugin_env(),
    }
    servers = {name: Server(model, root / f"serve_{name}.log", env) for name, env in envs.items()}
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in servers.values():
            server.wait_healthy(deadline)
        sent = prompts()
        with concurrent.futures.ThreadPoolExecutor(2 * len(sent)) as pool:
            futures = {
                name: [pool.submit(server.complete, p) for p in sent]
                for name, server in servers.items()
            }
            completions = {name: [f.result() for f in fs] for name, fs in futures.items()}
        records = [r for path in sorted(out_dir.glob("shadow.*.jsonl")) for r in read_records(path)]
        checks = sum(r["kind"] == "check" for r in records)
        metrics = metrics_once_exported(servers["on"], checks)
    finally:
        for server in servers.values():
            server.stop()
    return {
        name: Served(
            completions[name],
            records if name == "on" else [],
            metrics if name == "on" else "",
            server.log_path.read_text(),
            out_dir,
        )
        for name, server in servers.items()
    }
