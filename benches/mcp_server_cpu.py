"""The MCP server's CPU per tool call, as a real client drives it: the sandbox's process CPU time per `get_block`
call (an `on_client` step), less what the game spends idle over the same time, for both protocol generations
(2025-11-25 sessions, "legacy"; 2026-07-28, "auto"), alternating.

    cargo build --release --example sandbox
    bash tests/e2e/setup-venv.sh /tmp/e2e-venv
    /tmp/e2e-venv/bin/python benches/mcp_server_cpu.py target/release/examples/sandbox [CALLS]

The client (the official Python SDK) runs on the same machine and takes CPU of its own, which is not counted.
"""

import os
import subprocess
import sys
import tempfile
import time

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

PORT = 15871
ARGS = {"x": 0, "y": 40, "z": 0}


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(url: str, token: str, pid: int, mode: str, calls: int, idle_rate: float) -> float:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        for _ in range(50):  # warm-up: connections, first allocations
            await client.call_tool("get_block", ARGS)
        before, started = cpu_seconds(pid), time.monotonic()
        for _ in range(calls):
            result = await client.call_tool("get_block", ARGS)
            assert not result.is_error, result
        spent, elapsed = cpu_seconds(pid) - before, time.monotonic() - started
    return 1000 * (spent - idle_rate * elapsed) / calls


def main() -> None:
    binary, calls = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with tempfile.TemporaryDirectory() as data:
        flags = ["--no-console", "--world", "alpha", "--data-dir", data, "--port", str(PORT)]
        game = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            token_file = os.path.join(data, "mcp-token")
            for _ in range(300):
                if os.path.exists(token_file) and open(token_file).read().strip():
                    break
                time.sleep(0.1)
            token = open(token_file).read().strip()
            time.sleep(2)
            before = cpu_seconds(game.pid)
            time.sleep(5)
            idle_rate = (cpu_seconds(game.pid) - before) / 5
            print(f"idle: {1000 * idle_rate:.1f} ms of CPU per second")
            url = f"http://127.0.0.1:{PORT}/mcp"
            for mode in ["legacy", "auto"] * 3:
                per_call = anyio.run(run, url, token, game.pid, mode, calls, idle_rate)
                print(f"{mode:>6}: {per_call:.3f} ms of server CPU per call ({calls} calls)")
        finally:
            game.terminate()
            game.wait(timeout=30)


if __name__ == "__main__":
    main()
