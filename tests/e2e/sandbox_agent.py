"""An agent for the sandbox end-to-end test: the official Python MCP client, one scripted step per run.

Usage: python sandbox_agent.py URL TOKEN STEP   (STEP: place | tower | get)
Prints one JSON line per event, flushed, so the test can act on the console between them.
"""
import json
import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL, TOKEN, STEP = sys.argv[1], sys.argv[2], sys.argv[3]
GOLD = {"x": 3, "y": 60, "z": 3, "block": "gold"}


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def outcome(result) -> dict:
    if result.is_error:
        # An error result's text block is the error as JSON: {code, message, details}.
        text = next((block.text for block in result.content if getattr(block, "type", "") == "text"), "{}")
        error = json.loads(text)
        return {"error": error.get("code"), "details": error.get("details", {})}
    return {"ok": result.structured_content or {}}


async def main() -> None:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=httpx2.Timeout(30.0, read=300.0))
    async with Client(streamable_http_client(URL, http_client=http)) as client:
        if STEP == "place":
            # Sessionless (2026-07-28): the SDK names the client in every request, and that makes its calls one
            # conversation, within which a retry with the same operation id runs once.
            mine = {"operation_id": "op-gold"}
            first = await client.call_tool("place_block", {**GOLD, **mine})
            again = await client.call_tool("place_block", {**GOLD, **mine})
            conflict = await client.call_tool("place_block", {**GOLD, "block": "stone", **mine})
            after = await client.call_tool("get_block", {"x": 3, "y": 60, "z": 3})
            emit("placed", first=outcome(first), again=outcome(again), conflict=outcome(conflict), after=outcome(after))
        elif STEP == "tower":
            started = anyio.Event()

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                if not started.is_set():
                    started.set()
                    emit("tower-started")

            result = await client.call_tool(
                "build_tower", {"x": 10, "z": 10, "height": 64, "block": "planks"}, progress_callback=on_progress
            )
            emit("tower-ended", **outcome(result))
        elif STEP == "get":
            emit("block", **outcome(await client.call_tool("get_block", {"x": 3, "y": 60, "z": 3})))


anyio.run(main)
