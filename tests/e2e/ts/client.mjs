// End-to-end: the official TypeScript MCP client (@modelcontextprotocol/sdk, pinned in package.json) drives the
// sandbox's tools in a running game (tests/mcp_typescript.rs).
//
// Usage: node client.mjs URL TOKEN
// Prints one JSON line per check and exits non-zero on the first failed one. When it needs the player to enter a
// world it prints {"need": "enter"} and waits for a line on standard input.
import net from 'node:net';
import readline from 'node:readline';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [URL_, TOKEN] = process.argv.slice(2);

// The SDK's JSON Schema validator (ajv) warns on formats it does not know: count them, there must be none.
const warnings = [];
const warn = console.warn;
console.warn = (...args) => {
    warnings.push(args.map(String).join(' '));
    warn(...args);
};

function check(name, ok, detail) {
    process.stdout.write(JSON.stringify({ check: name, ok: Boolean(ok), detail: detail ?? null }) + '\n');
    if (!ok) {
        process.exit(1);
    }
}

const input = readline.createInterface({ input: process.stdin });
const lines = input[Symbol.asyncIterator]();
async function need(what) {
    process.stdout.write(JSON.stringify({ need: what }) + '\n');
    await lines.next();
}

/** A TCP proxy in front of the game whose connections can be cut, as a network hiccup would. */
function cuttableProxy(target) {
    const sockets = new Set();
    let cuts = 0;
    const server = net.createServer((client) => {
        const upstream = net.connect(Number(target.port), target.hostname);
        for (const socket of [client, upstream]) {
            sockets.add(socket);
            socket.on('close', () => sockets.delete(socket));
            socket.on('error', () => {});
        }
        client.pipe(upstream);
        upstream.pipe(client);
    });
    return new Promise((resolve) => {
        server.listen(0, '127.0.0.1', () => {
            resolve({
                url: `http://127.0.0.1:${server.address().port}${target.pathname}`,
                cut() {
                    cuts += 1;
                    for (const socket of sockets) {
                        socket.destroy();
                    }
                },
                get cuts() {
                    return cuts;
                },
                close: () => server.close()
            });
        });
    });
}

async function connect(url) {
    const client = new Client({ name: 'e2e-ts', version: '1.0.0' });
    const transport = new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { Authorization: `Bearer ${TOKEN}` } }
    });
    const errors = [];
    client.onerror = (error) => errors.push(String(error));
    await client.connect(transport);
    return { client, transport, errors };
}

/** The error of an error result, read as a person would: the JSON in its text block. */
function domainError(result) {
    if (!result.isError) {
        return null;
    }
    const text = result.content.find((block) => block.type === 'text')?.text ?? '';
    try {
        return JSON.parse(text);
    } catch {
        return { unreadable: text };
    }
}

async function expectError(client, name, args, code, field) {
    const result = await client.callTool({ name, arguments: args });
    const error = domainError(result);
    const meta = result._meta?.['bevy-agent-tools/error'];
    check(
        `${code}: ${name} answers it through callTool()`,
        error?.code === code &&
            typeof error.message === 'string' &&
            error.details !== undefined &&
            meta?.code === code &&
            result.structuredContent === undefined &&
            (field === undefined || error.details.field === field),
        { result }
    );
    return error;
}

async function main() {
    const { client, errors } = await connect(URL_);

    // tools/list: the sandbox's tools, with schemas a model (and ajv) can read.
    const { tools } = await client.listTools();
    const byName = Object.fromEntries(tools.map((tool) => [tool.name, tool]));
    check('tools listed', ['world_info', 'observe', 'place_block', 'break_block', 'build_tower'].every((n) => byName[n]), Object.keys(byName));
    const schemas = JSON.stringify(tools.map((tool) => [tool.inputSchema, tool.outputSchema]));
    check('no schemars formats in the schemas', !/"format":"(u?int\d*|uint|float|double)"/.test(schemas));
    check('no Rust docs in the input schemas', !schemas.includes('serde(flatten)') && byName.break_block.inputSchema.description === undefined, byName.break_block.inputSchema);
    check('the palette is an enum', byName.place_block.inputSchema.properties.block.enum?.includes('planks'), byName.place_block.inputSchema.properties.block);

    // Domain errors, each read through callTool().
    await expectError(client, 'world_info', {}, 'NO_WORLD');
    await need('enter');
    const info = await client.callTool({ name: 'world_info', arguments: {} });
    check('a call', !info.isError && info.structuredContent.world === 'alpha', info.structuredContent);
    // A NaN in an output travels as null, which the published output schema allows (else callTool() throws).
    const drift = await client.callTool({ name: 'drift', arguments: {} });
    check('a NaN in an output', !drift.isError && drift.structuredContent.speed === null && drift.structuredContent.heading === 1.5, drift);
    await expectError(client, 'place_block', { x: 9999, y: 60, z: 0, block: 'stone' }, 'INVALID_INPUT', 'x');
    await expectError(client, 'place_block', { y: 60, z: 0, block: 'stone' }, 'INVALID_INPUT', 'x');
    await expectError(client, 'break_block', { x: 0, y: 60, z: 0 }, 'CONFIRMATION_REQUIRED');
    const placed = await client.callTool({ name: 'place_block', arguments: { x: 3, y: 100, z: 3, block: 'gold', operation_id: 'op-1' } });
    check('a keyed call', !placed.isError && placed.structuredContent.block === 'gold', placed);
    await expectError(client, 'place_block', { x: 3, y: 100, z: 3, block: 'stone', operation_id: 'op-1' }, 'OPERATION_CONFLICT');
    await expectError(client, 'place_block', { x: 3, y: 100, z: 3, block: 'stone', expected_version: 0 }, 'VERSION_CONFLICT');

    // LOCATION_CHANGED: a tower is interrupted by a travel made by another call.
    let started;
    const progressed = new Promise((resolve) => (started = resolve));
    const tower = client.callTool({ name: 'build_tower', arguments: { x: 20, z: 20, height: 64, block: 'planks' } }, undefined, {
        onprogress: () => started(),
        timeout: 120000
    });
    await progressed;
    const travel = await client.callTool({ name: 'travel', arguments: { dimension: 'nether' } });
    check('travel', !travel.isError, travel);
    const interrupted = domainError(await tower);
    check('LOCATION_CHANGED: build_tower answers it through callTool()', interrupted?.code === 'LOCATION_CHANGED' && interrupted.details.placed >= 1, interrupted);

    // Every progress report reaches the client before the result.
    for (let round = 0; round < 10; round += 1) {
        const seen = [];
        const result = await client.callTool({ name: 'build_tower', arguments: { x: round, z: 40, height: 3, block: 'stone' } }, undefined, {
            onprogress: (progress) => seen.push(progress.progress)
        });
        check(`progress ${round}: one report per block, all before the result`, !result.isError && result.structuredContent.placed === 3 && seen.join() === '1,2,3', { seen, result: result.structuredContent });
    }

    // observe: the picture travels once, as image content, and the whole answer is small.
    const observed = await client.callTool({ name: 'observe', arguments: { radius: 32 } });
    const images = observed.content.filter((block) => block.type === 'image');
    const texts = observed.content.filter((block) => block.type === 'text').map((block) => block.text).join('');
    const wire = JSON.stringify({ jsonrpc: '2.0', id: 1, result: observed }).length;
    check(
        'observe sends its picture once, as image content, under 30 KB',
        !observed.isError && images.length === 1 && !texts.includes('iVBOR') && wire < 30000,
        { wire, images: images.length }
    );
    // Codex and Claude Code give their model a result's structuredContent alone when it has one: a result with a
    // picture has none (nor its tool an output schema, which the SDK would hold it to), and its text is the rest.
    const summary = JSON.parse(texts);
    check(
        'observe: no structuredContent and no output schema, the text says the rest',
        observed.structuredContent === undefined && byName.observe.outputSchema === undefined && typeof summary.summary === 'string',
        { structured: observed.structuredContent, outputSchema: byName.observe.outputSchema, texts }
    );

    // Cancel through an AbortSignal: the game sees the call cancelled (tests/mcp_typescript.rs checks that).
    const abort = new AbortController();
    let first;
    const reported = new Promise((resolve) => (first = resolve));
    const cancelled = client
        .callTool({ name: 'build_tower', arguments: { x: 30, z: 30, height: 64, block: 'glass' } }, undefined, {
            signal: abort.signal,
            onprogress: () => first()
        })
        .then(
            () => 'resolved',
            (error) => String(error)
        );
    await reported;
    abort.abort('the user changed their mind');
    const how = await cancelled;
    check('cancel through an AbortSignal', how !== 'resolved', how);
    const after = await client.callTool({ name: 'world_info', arguments: {} });
    check('usable after cancel', !after.isError, after);

    check('no validator warnings', warnings.length === 0, warnings);
    // A report the game sent before the cancel reached it can still arrive after the SDK forgot the token: MCP
    // allows that race (both sides handle it) and the SDK reports it as an error. At most that one; the server sends
    // none once it has the cancel (src/mcp/server.rs).
    const late = errors.filter((error) => error.includes('progress notification for an unknown token'));
    check('no progress after the cancel but the one in flight', late.length <= 1, late);
    check('no transport errors', errors.length === late.length, errors);
    await client.close();

    // A stream cut while a call runs: the client resumes with Last-Event-ID after the server's retry interval
    // (3 s), when the call has long finished; it still gets every progress report and the result.
    const proxy = await cuttableProxy(new URL(URL_));
    const resumed = await connect(proxy.url);
    const seen = [];
    let cutNow;
    const firstReport = new Promise((resolve) => (cutNow = resolve));
    const call = resumed.client.callTool({ name: 'build_tower', arguments: { x: 50, z: 50, height: 5, block: 'planks' } }, undefined, {
        onprogress: (progress) => {
            seen.push(progress.progress);
            cutNow();
        },
        timeout: 60000
    });
    await firstReport;
    proxy.cut();
    const result = await call;
    check(
        'a resumed stream after a cut delivers the result and every report',
        proxy.cuts === 1 && !result.isError && result.structuredContent.placed === 5 && seen.join() === '1,2,3,4,5',
        { seen, result: result.structuredContent, errors: resumed.errors }
    );
    await resumed.client.close();
    proxy.close();
}

main().then(
    () => process.exit(0),
    (error) => {
        check('no exception', false, String(error?.stack ?? error));
    }
);
