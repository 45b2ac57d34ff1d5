// Test helpers: build the real ledgerd and ledgerctl from this repository
// once, start ledgerd on a free loopback port with a temporary SQLite
// file, and stop every process at the end.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before } from "node:test";
import { createInterface } from "node:readline";
import { buildBinaries } from "./build.mjs";

let bins;
const started = [];
const dirs = [];

after(() => {
  for (const d of started) d.stop();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  if (bins) rmSync(bins, { recursive: true, force: true });
});

/**
 * Returns the folder holding freshly built ledgerd (its test build, whose
 * clock a test moves through LEDGERD_TEST_CLOCK_FILE; the released binary
 * reads no test variable) and ledgerctl: LEDGER_TEST_BINS when test/run.mjs
 * built them once for every test file, else built now and removed at the
 * end.
 */
export function buildLedger() {
  if (process.env.LEDGER_TEST_BINS) return process.env.LEDGER_TEST_BINS;
  if (!bins) bins = buildBinaries();
  return bins;
}

/** Runs ledgerctl and returns its stdout. */
export function ledgerctl(...args) {
  return execFileSync(join(buildLedger(), "ledgerctl"), args, { encoding: "utf8" }).trim();
}

/** A new temporary database path. */
export function tempDB() {
  const dir = mkdtempSync(join(tmpdir(), "ledger-ts-db-"));
  dirs.push(dir);
  return join(dir, "ledger.db");
}

/**
 * Starts ledgerd on db (a new one when omitted) with extra args, and
 * resolves once it logs that it is ready: {url, db, logs, stop()}.
 */
export async function startLedgerd({ db = tempDB(), args = [], env = {} } = {}) {
  if (!args.includes("--default-payloads")) {
    // Most tests check keys and fingerprints of an inline namespace (dk_,
    // sha256:); a new ledger is committed by default (contract §14), which
    // the derived-key and subject tests start.
    args = ["--default-payloads", "inline", ...args];
  }
  const proc = spawn(join(buildLedger(), "ledgerd"), ["--db", db, "--listen", "127.0.0.1:0", "--log-format", "json", ...args], {
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, ...env },
  });
  const logs = [];
  const d = {
    db,
    logs,
    url: "",
    stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
    },
    stopGracefully() {
      return new Promise((res) => {
        proc.once("exit", res);
        proc.kill("SIGTERM");
      });
    },
  };
  started.push(d);
  d.url = await new Promise((res, rej) => {
    const lines = createInterface({ input: proc.stderr });
    lines.on("line", (line) => {
      logs.push(line);
      try {
        const rec = JSON.parse(line);
        if (rec.msg === "ledgerd ready") res("http://" + rec.addr);
      } catch {
        // not a JSON line
      }
    });
    proc.once("exit", (code) => rej(new Error(`ledgerd exited (${code}) before it was ready:\n${logs.join("\n")}`)));
  });
  return d;
}

/** Starts a ledgerd whose tokens exist before its first request: [ledgerd, {name: token}]. */
export async function startWithTokens(tokens, args = []) {
  const first = await startLedgerd();
  await first.stopGracefully();
  const made = {};
  for (const [role, name, ...more] of tokens) {
    made[name] = ledgerctl("token", "create", "--db", first.db, "--role", role, "--name", name, ...more);
  }
  return [await startLedgerd({ db: first.db, args }), made];
}

/**
 * The ledgerd a test file's tests share: {url, db, logs, stop()}, filled
 * in before the first test runs.
 */
export function sharedLedgerd() {
  const server = {};
  before(async () => {
    Object.assign(server, await startLedgerd());
  });
  return server;
}

let n = 0;
/** A fresh suffix, so each test's keys and tools are its own. */
export function uid() {
  return `${process.pid}-${Date.now().toString(36)}-${++n}`;
}
