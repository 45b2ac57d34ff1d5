#!/usr/bin/env node
// Runs the ledger-mcp binary of this platform with this process's
// arguments, standard streams and exit status. The binary comes in the
// optional dependency @effect-ledger/ledger-mcp-<platform>-<arch> that npm
// installed beside this package (npm installs only the one whose os and
// cpu match); nothing is downloaded at install or run time.
'use strict';
const { spawn } = require('node:child_process');

const target = `${process.platform}-${process.arch}`;
const pkg = `@effect-ledger/ledger-mcp-${target}`;
const exe = process.platform === 'win32' ? 'ledger-mcp.exe' : 'ledger-mcp';
let bin;
try {
  bin = require.resolve(`${pkg}/bin/${exe}`);
} catch {
  process.stderr.write(`ledger-mcp: no binary for ${target}: the optional dependency ${pkg} is not installed. ` +
    'Binaries are published for linux-x64, linux-arm64, darwin-x64, darwin-arm64 and win32-x64; ' +
    'npm skips optional dependencies under --omit=optional. Elsewhere: go install ' +
    'github.com/effect-ledger/effect-ledger/cmd/ledger-mcp@VERSION\n');
  process.exit(1);
}

const child = spawn(bin, process.argv.slice(2), { stdio: 'inherit', windowsHide: true });
// The host stops the gateway with a signal: pass it on, and let the
// gateway's exit end this process.
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => child.kill(sig));
}
child.on('error', (err) => {
  process.stderr.write(`ledger-mcp: cannot run ${bin}: ${err.message}\n`);
  process.exit(1);
});
child.on('exit', (code, signal) => {
  if (signal) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
    return;
  }
  process.exit(code ?? 1);
});
