// Runs `npx @effect-ledger/ledger-mcp -- node <server-memory>` as an MCP
// host would, from the packages test/release/install_test.go installed
// from the release's tarballs, and makes one real tools/call twice: the
// second is the ledger's replay. The client SDK and the memory server are
// the ones test/mcp-node/package-lock.json pins.
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js';

const require = createRequire(import.meta.url);
const memoryServer = path.join(path.dirname(require.resolve('@modelcontextprotocol/server-memory/package.json')), 'dist', 'index.js');

const client = new Client({ name: 'npx-check', version: '1.0.0' });
await client.connect(new StdioClientTransport({
  command: 'npx',
  args: ['--no-install', '@effect-ledger/ledger-mcp', '--', process.execPath, memoryServer],
  stderr: 'inherit',
  env: { ...getDefaultEnvironment(), XDG_STATE_HOME: process.env.XDG_STATE_HOME, MEMORY_FILE_PATH: process.env.MEMORY_FILE_PATH },
}));
const call = { name: 'create_entities', arguments: { entities: [{ name: 'ada', entityType: 'person', observations: ['npx'] }] } };
const first = await client.callTool(call);
assert.equal(first.isError, undefined, JSON.stringify(first));
assert.equal(first.structuredContent.entities.length, 1);
const again = await client.callTool(call);
assert.equal(again._meta['io.effect-ledger/replayed'], true, JSON.stringify(again));
assert.deepEqual(again.structuredContent, first.structuredContent);
await client.close();
console.log('npx @effect-ledger/ledger-mcp: one create_entities ran, its repeat was replayed');
