// Drives ledger-mcp with the TypeScript MCP SDK's client (it speaks
// 2025-11-25) in front of the reference "everything" server, whose tools
// ask their client during the call: elicitation/create,
// sampling/createMessage and roots/list must reach this client and its
// answers the server. Run by test/mcp_node_test.go, which sets
// LEDGER_MCP (the binary) and LEDGER_MCP_DB (its ledger).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import {
  CallToolResultSchema, CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema, LoggingMessageNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';

const require = createRequire(import.meta.url);
const everything = path.join(path.dirname(require.resolve('@modelcontextprotocol/server-everything/package.json')), 'dist', 'index.js');

const asked = { elicit: 0, sample: 0, roots: 0 };
const logs = [];
let action = 'accept';

const client = new Client({ name: 'node-agent', version: '1.0.0' },
  { capabilities: { elicitation: {}, sampling: {}, roots: { listChanged: true } } });
client.setRequestHandler(ElicitRequestSchema, async () => {
  asked.elicit++;
  return action === 'accept' ? { action, content: { name: 'Ada' } } : { action };
});
client.setRequestHandler(CreateMessageRequestSchema, async () => {
  asked.sample++;
  return { role: 'assistant', model: 'node-model', content: { type: 'text', text: 'hello from the node client' } };
});
client.setRequestHandler(ListRootsRequestSchema, async () => {
  asked.roots++;
  return { roots: [{ uri: 'file:///node-agent/project', name: 'project' }] };
});
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => { logs.push(n.params); });

await client.connect(new StdioClientTransport({
  command: process.env.LEDGER_MCP, stderr: 'inherit',
  args: ['--db', process.env.LEDGER_MCP_DB, '--', process.execPath, everything, 'stdio'],
}));
await client.setLoggingLevel('debug');

test('the tools for a client with elicitation, sampling and roots are listed', async () => {
  const names = (await client.listTools()).tools.map((t) => t.name);
  for (const name of ['trigger-elicitation-request', 'trigger-sampling-request', 'get-roots-list']) {
    assert.ok(names.includes(name), `${name} in ${names}`);
  }
});

test('roots/list reaches the client: the server sees its roots', async () => {
  const res = await client.callTool({ name: 'get-roots-list', arguments: {} });
  assert.match(res.content[0].text, /file:\/\/\/node-agent\/project/);
  assert.ok(asked.roots >= 1);
});

test('sampling/createMessage reaches the client; the repeat is replayed', async () => {
  const args = { prompt: 'name a colour', maxTokens: 5 };
  const res = await client.callTool({ name: 'trigger-sampling-request', arguments: args });
  assert.equal(res.isError, undefined);
  assert.match(res.content[0].text, /hello from the node client/);
  assert.equal(asked.sample, 1);
  const again = await client.callTool({ name: 'trigger-sampling-request', arguments: args });
  assert.equal(again._meta['io.effect-ledger/replayed'], true);
  assert.equal(asked.sample, 1, 'not asked again');
});

test('elicitation/create reaches the client: a decline and, under another key, an acceptance', async () => {
  const call = (key) => client.request({ method: 'tools/call', params: {
    name: 'trigger-elicitation-request', idempotencyKey: key, arguments: {} } }, CallToolResultSchema);
  action = 'decline';
  const no = await call('node-elicit-1');
  assert.match(no.content[0].text, /declined/);
  // The server answered the decline as a success: recorded and replayed,
  // the client is not asked again.
  const again = await call('node-elicit-1');
  assert.equal(again._meta['io.effect-ledger/replayed'], true);
  assert.equal(asked.elicit, 1);
  action = 'accept';
  const yes = await call('node-elicit-2');
  assert.match(yes.content.map((c) => c.text).join('\n'), /Ada/);
  assert.equal(asked.elicit, 2);
});

test('log messages of the server reach the client', async () => {
  assert.ok(logs.some((l) => l.logger === 'everything-server'), JSON.stringify(logs));
});

test('close', async () => {
  await client.close();
});
