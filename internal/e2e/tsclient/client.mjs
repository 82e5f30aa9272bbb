// capgate end-to-end client: drives an MCP server over streamable HTTP with
// the official TypeScript SDK (@modelcontextprotocol/sdk), exactly as a
// third-party MCP client would, and prints ONE JSON object on stdout that
// says what it saw. The Go test internal/e2e/tsclient_test.go runs it.
//
// Environment:
//   CAPGATE_MCP_URL      the MCP endpoint, e.g. http://127.0.0.1:PORT/mcp (required)
//   CAPGATE_TOKEN        the bearer token; empty selects the bad-token mode
//   CAPGATE_BAD_TOKEN=1  bad-token mode: connect with a token the server must
//                        refuse and print {error, status, wwwAuthenticate, ...}
//   CAPGATE_TOOL_PREFIX  the exposed-name prefix of the fixture's tools
//                        (default "fx__"; "" to target the MCP fixture itself)
//   CAPGATE_SKIP_CALLS=1 only connect and list tools (for narrowed tokens)
//
// Normal mode prints
//   {protocolVersion, serverInfo, tools, echo, denied, progress, slow, http}
// and exits 0; any thrown error goes to stderr with exit status 1.
// Bad-token mode prints {error, status, wwwAuthenticate, http} and exits 0
// when the connection was refused, 1 when it unexpectedly succeeded.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = process.env.CAPGATE_MCP_URL;
if (!url) {
  process.stderr.write("CAPGATE_MCP_URL is not set\n");
  process.exit(2);
}
const token = process.env.CAPGATE_TOKEN ?? "";
const badMode = token === "" || process.env.CAPGATE_BAD_TOKEN === "1";
const prefix = process.env.CAPGATE_TOOL_PREFIX ?? "fx__";
const skipCalls = process.env.CAPGATE_SKIP_CALLS === "1";

// Every HTTP exchange the transport makes, so a failure (or the test) can
// see how the server answered: method, status, content type, and the
// WWW-Authenticate challenge of a 401.
const http = [];
let lastChallenge = null;
const recordingFetch = async (input, init) => {
  const res = await fetch(input, init);
  const entry = {
    method: init?.method ?? "GET",
    status: res.status,
    contentType: res.headers.get("content-type"),
  };
  const challenge = res.headers.get("www-authenticate");
  if (challenge) {
    entry.wwwAuthenticate = challenge;
    lastChallenge = { status: res.status, wwwAuthenticate: challenge };
  }
  http.push(entry);
  return res;
};

function makeTransport(bearer) {
  return new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: "Bearer " + bearer } },
    fetch: recordingFetch,
    // No retries of the standalone GET stream: a test should see failures.
    reconnectionOptions: {
      initialReconnectionDelay: 1000,
      maxReconnectionDelay: 1000,
      reconnectionDelayGrowFactor: 1,
      maxRetries: 0,
    },
  });
}

function makeClient() {
  return new Client({ name: "capgate-e2e-tsclient", version: "0.0.0" });
}

async function listAllTools(client) {
  const names = [];
  let cursor;
  for (let page = 0; page < 100; page++) {
    const res = await client.listTools(cursor ? { cursor } : undefined);
    for (const t of res.tools) names.push(t.name);
    cursor = res.nextCursor;
    if (!cursor) return names;
  }
  throw new Error("tools/list did not end after 100 pages");
}

async function badTokenMode() {
  const client = makeClient();
  const transport = makeTransport(token === "" ? "not-a-valid-token" : token);
  try {
    await client.connect(transport);
  } catch (err) {
    const out = {
      error: String(err?.message ?? err),
      name: err?.name ?? null,
      status: typeof err?.code === "number" ? err.code : (lastChallenge?.status ?? null),
      wwwAuthenticate: lastChallenge?.wwwAuthenticate ?? null,
      http,
    };
    process.stdout.write(JSON.stringify(out) + "\n");
    await client.close().catch(() => {});
    return 0;
  }
  await client.close().catch(() => {});
  process.stdout.write(JSON.stringify({ error: null, connected: true, http }) + "\n");
  process.stderr.write("connected with a bad token; the server should have refused it\n");
  return 1;
}

async function normalMode() {
  const client = makeClient();
  const transport = makeTransport(token);
  let closing = false;
  client.onerror = (err) => {
    // Transport-level errors that do not fail a request (for example the
    // optional standalone GET stream) are reported on stderr only; closing
    // aborts that stream, which is not worth a line.
    if (closing) return;
    process.stderr.write("client error: " + String(err?.message ?? err) + "\n");
  };
  await client.connect(transport);
  const out = {
    protocolVersion: transport.protocolVersion ?? null,
    serverInfo: client.getServerVersion() ?? null,
    sessionId: transport.sessionId ?? null,
  };
  out.tools = await listAllTools(client);
  if (!skipCalls) {
    out.echo = await client.callTool({ name: prefix + "echo", arguments: { message: "hi" } });
    out.denied = await client.callTool({ name: prefix + "t_00", arguments: {} });
    out.progress = [];
    out.slow = await client.callTool(
      { name: prefix + "slow", arguments: { delay_ms: 20 } },
      undefined,
      {
        onprogress: (p) => {
          out.progress.push({ progress: p.progress, total: p.total, message: p.message });
        },
      },
    );
  }
  closing = true;
  // End the session the way a polite client does (DELETE); a server that
  // does not support it answers 405, which the SDK accepts.
  try {
    await transport.terminateSession();
    out.terminated = true;
  } catch (err) {
    out.terminated = String(err?.message ?? err);
  }
  await client.close();
  out.http = http;
  process.stdout.write(JSON.stringify(out) + "\n");
  return 0;
}

try {
  process.exitCode = badMode ? await badTokenMode() : await normalMode();
} catch (err) {
  process.stderr.write(String(err?.stack ?? err?.message ?? err) + "\n");
  if (http.length) process.stderr.write("http: " + JSON.stringify(http) + "\n");
  process.exitCode = 1;
}
