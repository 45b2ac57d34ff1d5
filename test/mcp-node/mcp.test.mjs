// Drives ledger-mcp with the TypeScript MCP SDK's client in front of the
// reference memory server, and compares it with the server reached
// directly. Run by test/mcp_node_test.go, which sets LEDGER_MCP (the
// binary), LEDGER_MCP_DB (its ledger) and WORK_DIR (memory files).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const require = createRequire(import.meta.url);
const memoryServer = path.join(path.dirname(require.resolve('@modelcontextprotocol/server-memory/package.json')), 'dist', 'index.js');
const work = process.env.WORK_DIR;

async function connect(command, args, memoryFile) {
  const client = new Client({ name: 'node-agent', version: '1.0.0' });
  const transport = new StdioClientTransport({
    command, args, stderr: 'inherit',
    env: { ...getDefaultEnvironment(), MEMORY_FILE_PATH: memoryFile },
  });
  await client.connect(transport);
  return client;
}

const direct = await connect(process.execPath, [memoryServer], path.join(work, 'direct.jsonl'));
const gated = await connect(process.env.LEDGER_MCP,
  ['--db', process.env.LEDGER_MCP_DB, '--', process.execPath, memoryServer], path.join(work, 'gated.jsonl'));

const entities = { entities: [{ name: 'ada', entityType: 'person', observations: ['wrote the first program'] }] };

test('tools/list through ledger-mcp is the server\'s own', async () => {
  const want = await direct.listTools();
  const got = await gated.listTools();
  assert.deepEqual(got, want);
  assert.deepEqual(gated.getServerVersion(), direct.getServerVersion());
});

test('a repeated create_entities is replayed, not run again', async () => {
  const first = await gated.callTool({ name: 'create_entities', arguments: entities });
  assert.equal(first.isError, undefined);
  assert.equal(first.structuredContent.entities.length, 1);
  const again = await gated.callTool({ name: 'create_entities', arguments: entities });
  // Run again, the server would answer with no new entities. The replay
  // says so in a text block before the recorded content.
  assert.match(again.content[0].text, /^\[Replayed: this exact call already ran/);
  assert.deepEqual(again.content.slice(1), first.content);
  assert.deepEqual(again.structuredContent, first.structuredContent);
  assert.equal(again._meta['io.effect-ledger/replayed'], true);
  assert.match(again._meta['io.effect-ledger/key'], /^dk2_[0-9a-f]{64}$/);
  assert.equal(typeof again._meta['io.effect-ledger/receipt'].seq, 'number');
});

test('params.idempotencyKey names the effect', async () => {
  const call = (name) => gated.request({ method: 'tools/call', params: {
    name: 'create_entities', idempotencyKey: 'node-key-grace',
    arguments: { entities: [{ name, entityType: 'person', observations: [] }] } } }, CallToolResultSchema);
  const first = await call('grace');
  assert.equal(first.isError, undefined);
  const other = await call('linus');
  assert.equal(other.isError, true);
  assert.equal(other._meta['io.effect-ledger/status'], 'fingerprint_mismatch');
  assert.equal(other._meta['io.effect-ledger/key'], 'node-key-grace');
});

test('read_graph passes through', async () => {
  const a = await gated.callTool({ name: 'read_graph', arguments: {} });
  const b = await gated.callTool({ name: 'read_graph', arguments: {} });
  assert.equal(a._meta, undefined);
  assert.deepEqual(b, a);
  assert.deepEqual(a.structuredContent.entities.map((e) => e.name).sort(), ['ada', 'grace']);
});

test('close', async () => {
  await gated.close();
  await direct.close();
});
