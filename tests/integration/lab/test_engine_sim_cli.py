"""``slofleet engine-sim`` as a process: serves the openai client, stops cleanly on SIGTERM, and
refuses bad settings with a message and exit code 2."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from slo_core.cli import main

CLI = [sys.executable, "-m", "slo_core.cli", "--log-level", "WARNING", "engine-sim", "--host", "127.0.0.1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_cli_serves_and_stops_on_sigterm() -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [*CLI, "--port", str(port), "--speedup", "50", "--policy", "edf", "--max-num-seqs", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "engine-sim did not become healthy"
            time.sleep(0.2)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as client:
            model = client.models.list().data[0].id
            out = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=6,
                extra_body={"ignore_eos": True},
            )
        assert out.usage is not None and out.usage.completion_tokens == 6
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--policy", "no-such-policy"], "unknown engine policy"),
        (["--policy-params", "[1]"], "JSON object"),
        (["--profile", "tpu-v9-llama"], "valid names"),
        (["--speedup", "0"], "speedup"),
    ],
)
def test_cli_rejects_bad_settings_with_a_message(args: list[str], says: str, capsys) -> None:
    assert main(["engine-sim", "--port", "1", *args]) == 2
    assert says in capsys.readouterr().err
