"""End-to-end: the official Python MCP client (PyPI `mcp`) drives a running game.

Usage: python client.py URL TOKEN
Checks, in both protocol generations: list tools, call one, see a domain error, a call that outlasts the client's
read timeout, cancel a long call.
Prints one JSON line per check; exits non-zero on the first failed check.
"""
import json
import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL, TOKEN = sys.argv[1], sys.argv[2]


def check(name: str, ok: bool, detail: object = None) -> None:
    print(json.dumps({"check": name, "ok": bool(ok), "detail": detail}), flush=True)
    if not ok:
        sys.exit(1)


def domain_error(result) -> dict:
    """The error of an error result, as every client shows it: the JSON in its text block."""
    text = next((block.text for block in result.content if getattr(block, "type", "") == "text"), "")
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text}


def transport():
    # As the README shows it: a client of httpx's defaults (a 5 s read timeout) carrying the token.
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"})
    return streamable_http_client(URL, http_client=http)


async def run(mode: str) -> None:
    async with Client(transport(), mode=mode) as client:
        version = client.session.protocol_version
        check(f"{mode}: negotiated", version in ("2025-11-25", "2026-07-28"), version)

        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        check(f"{mode}: tools listed", {"bump", "long"} <= set(tools), sorted(tools))
        check(f"{mode}: reserved arguments", "operation_id" in tools["bump"].input_schema["properties"])

        result = await client.call_tool("bump", {"by": 2})
        check(f"{mode}: call", not result.is_error and result.structured_content["counter"] >= 2, result.structured_content)

        error = await client.call_tool("bump", {"by": "lots"})
        read = domain_error(error)
        ok = error.is_error and read.get("code") == "INVALID_INPUT" and read["details"]["field"] == "by"
        check(f"{mode}: domain error", ok and error.structured_content is None, read)

        # Without a handle, a retry runs once too: in the client's MCP session (2025-11-25), or, sessionless
        # (2026-07-28), in the conversation of the client's name, which the SDK sends in every request.
        plain = [await client.call_tool("bump", {"by": 5, "operation_id": f"plain-{mode}"}) for _ in range(2)]
        once = plain[0].structured_content == plain[1].structured_content
        check(f"{mode}: replay without a handle runs once", once, [p.structured_content for p in plain])

        # A handle the server minted makes a conversation of its own (apart from other copies of this client);
        # with a session it is another conversation too.
        begun = await client.call_tool("begin_conversation", {})
        handle = begun.structured_content["conversation"]
        mine = {"conversation": handle}
        replay = [await client.call_tool("bump", {"by": 5, "operation_id": f"op-{mode}", **mine}) for _ in range(2)]
        same = replay[0].structured_content == replay[1].structured_content
        check(f"{mode}: replay runs once", same, [r.structured_content for r in replay])
        # Another client (no handle, or another handle) with the same operation id runs its own operation.
        other = await client.call_tool("bump", {"by": 5, "operation_id": f"op-{mode}"})
        theirs = other.structured_content["counter"] != replay[0].structured_content["counter"]
        check(f"{mode}: another conversation never gets this one's replay", theirs, other.structured_content)
        forged = await client.call_tool("bump", {"by": 1, "conversation": "cv-made-up"})
        check(f"{mode}: a handle the game did not mint is refused", domain_error(forged).get("code") == "CONVERSATION_NOT_FOUND")

        # A call that runs longer than httpx's read timeout, reporting nothing: the server keeps its answer alive.
        slow = await client.call_tool("slow", {})
        check(f"{mode}: a call longer than the client's read timeout", not slow.is_error, slow.structured_content)

        progress = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        with anyio.move_on_after(30) as scope:
            async with anyio.create_task_group() as group:

                async def long_call() -> None:
                    await client.call_tool("long", {}, progress_callback=on_progress)

                group.start_soon(long_call)
                while not progress:
                    await anyio.sleep(0.01)
                group.cancel_scope.cancel()
        check(f"{mode}: cancelled a long call after progress", not scope.cancelled_caught and progress, progress[:3])

        after = await client.call_tool("bump", {})
        check(f"{mode}: usable after cancel", not after.is_error)


async def main() -> None:
    for mode in ("auto", "legacy"):
        await run(mode)


anyio.run(main)
