// harvest.mjs installs pinned public MCP server packages from npm, starts
// each over stdio (dummy credentials: only tools/list is asked, nothing is
// called) and writes the tools each lists, with package@version, to
// ../corpus/<server>.json. Run: node harvest.mjs WORKDIR
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const specs = JSON.parse(fs.readFileSync(path.join(here, "servers.json"), "utf8"));
const work = process.argv[2] || "/tmp/capgate-harvest";
const only = process.argv[3];
fs.mkdirSync(work, { recursive: true });
fs.mkdirSync(path.join(work, "files"), { recursive: true });

function binOf(dir, pkg, want) {
  const pj = JSON.parse(fs.readFileSync(path.join(dir, "node_modules", pkg, "package.json"), "utf8"));
  let bin = pj.bin;
  if (typeof bin === "string") return path.join(dir, "node_modules", pkg, bin);
  const names = Object.keys(bin);
  const name = want && bin[want] ? want : names[0];
  return path.join(dir, "node_modules", pkg, bin[name]);
}

function listTools(cmd, args, env) {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "pipe"] });
    let buf = "", tools = [], stderr = "";
    const timer = setTimeout(() => { p.kill("SIGKILL"); reject(new Error("timeout; stderr: " + stderr.slice(-400))); }, 60000);
    const send = (m) => p.stdin.write(JSON.stringify(m) + "\n");
    p.stderr.on("data", (d) => { stderr += d; });
    p.on("exit", (code) => { clearTimeout(timer); reject(new Error("exited " + code + "; stderr: " + stderr.slice(-400))); });
    p.stdout.on("data", (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 1);
        let m; try { m = JSON.parse(line); } catch { continue; }
        if (m.id === 1) {
          send({ jsonrpc: "2.0", method: "notifications/initialized" });
          send({ jsonrpc: "2.0", id: 2, method: "tools/list", params: {} });
        } else if (m.id >= 2) {
          if (m.error) { clearTimeout(timer); p.removeAllListeners("exit"); p.kill("SIGKILL"); reject(new Error(JSON.stringify(m.error))); return; }
          tools.push(...m.result.tools);
          if (m.result.nextCursor) send({ jsonrpc: "2.0", id: m.id + 1, method: "tools/list", params: { cursor: m.result.nextCursor } });
          else { clearTimeout(timer); p.removeAllListeners("exit"); p.kill("SIGKILL"); resolve(tools); }
        }
      }
    });
    send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "capgate-harvest", version: "1" } } });
  });
}

for (const s of specs) {
  if (only && s.server !== only) continue;
  const dir = path.join(work, s.server);
  fs.mkdirSync(dir, { recursive: true });
  try {
    execFileSync("npm", ["install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", dir, `${s.package}@${s.version}`], { stdio: "ignore" });
    const bin = binOf(dir, s.package, s.bin);
    const args = (s.args || []).map((a) => a.replace("$FILES", path.join(work, "files")));
    const tools = await listTools("node", [bin, ...args], s.env || {});
    const out = {
      server: s.server, package: `${s.package}@${s.version}`,
      how: "tools/list over stdio from the npm package, started with " + JSON.stringify({ args: s.args || [], env: Object.keys(s.env || {}) }),
      tools: tools.map((t) => ({ name: t.name, description: t.description || "", inputSchema: t.inputSchema || { type: "object" } })),
    };
    fs.writeFileSync(path.join(here, "..", "corpus", s.server + ".json"), JSON.stringify(out, null, 1) + "\n");
    console.log(s.server, tools.length);
  } catch (e) {
    console.log(s.server, "FAILED", String(e.message).slice(0, 500));
  }
}
