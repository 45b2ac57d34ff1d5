// Builds the real ledgerd (its test build) and ledgerctl of this
// repository into a new temporary folder and returns it.

import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

export function buildBinaries() {
  const dir = mkdtempSync(join(tmpdir(), "ledger-ts-bin-"));
  for (const [cmd, pkg] of [["ledgerd", "./test/testdata/ledgerd-test"], ["ledgerctl", "./cmd/ledgerctl"]]) {
    execFileSync("go", ["build", "-o", join(dir, cmd), pkg], {
      cwd: REPO,
      env: { ...process.env, CGO_ENABLED: "1" },
      stdio: ["ignore", "inherit", "inherit"],
    });
  }
  return dir;
}
