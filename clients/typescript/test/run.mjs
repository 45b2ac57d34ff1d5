// npm test: builds ledgerd and ledgerctl once for every test file (each
// runs in a process of its own), then runs them all. A file run alone
// (node --test test/x.test.mjs) builds its own.

import { spawnSync } from "node:child_process";
import { readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { buildBinaries } from "./build.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const bins = buildBinaries();
const files = readdirSync(here).filter((f) => f.endsWith(".test.mjs")).sort().map((f) => join(here, f));
const run = spawnSync(process.execPath, ["--test", ...files], { stdio: "inherit", env: { ...process.env, LEDGER_TEST_BINS: bins } });
rmSync(bins, { recursive: true, force: true });
process.exit(run.status ?? 1);
