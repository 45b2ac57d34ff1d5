// The Vercel AI SDK (the real `ai` package, pinned in package-lock.json)
// with its scripted MockLanguageModelV3 — no network — and tools wrapped
// by ledgerTool, against a real ledgerd.

import { test } from "node:test";
import assert from "node:assert/strict";
import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { Client, deriveKey } from "../dist/index.js";
import { ledgerTool } from "../dist/ai.js";
import { ledgerctl, uid } from "./ledgerd.mjs";
import { gatedLedgerd, keyState, pendingAsks } from "./frameworks.mjs";

const server = gatedLedgerd();

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
const call = (id, toolName, input) => ({ content: [{ type: "tool-call", toolCallId: id, toolName, input: JSON.stringify(input) }],
  finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [] });
const text = (t) => ({ content: [{ type: "text", text: t }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] });
/** The outputs of the approved tool calls an SDK call ran before its first step. */
const approvedOutputs = (r) => r.response.messages.filter((m) => m.role === "tool").flatMap((m) => m.content)
  .filter((p) => p.type === "tool-result").map((p) => p.output.value);
/** A model that answers each generate with the next step, then "done". */
const scripted = (...steps) => new MockLanguageModelV3({ doGenerate: async () => steps.shift() ?? text("done") });

test("the same tool called twice runs once; the second call gets the recorded result", async () => {
  const c = new Client(server.url);
  const order = uid();
  let ran = 0;
  const refund = ledgerTool(tool({
    description: "Refund an order",
    inputSchema: z.object({ order: z.string() }),
    execute: async ({ order }) => ({ refund: `re_${order}`, n: ++ran }),
  }), { client: c, tool: "payments.refund" });
  const res = await generateText({ model: scripted(call("call-1", "refund", { order }), call("call-2", "refund", { order })),
    tools: { refund }, prompt: "refund it twice", stopWhen: stepCountIs(5) });
  assert.equal(ran, 1);
  const results = res.steps.flatMap((s) => s.toolResults);
  assert.deepEqual(results.map((r) => r.output), [{ refund: `re_${order}`, n: 1 }, { refund: `re_${order}`, n: 1 }]);
  const key = deriveKey("payments.refund", { order });
  assert.equal(await keyState(server.url, key), "succeeded");
  const receipts = (await (await fetch(`${server.url}/v1/effects/${key}`)).json()).receipts;
  assert.deepEqual(receipts.map((r) => [r.kind, r.execution_id]), [["reserve", "call-1"], ["commit", "call-1"], ["replay", "call-2"]],
    "the toolCallId is the execution");
});

test("a failure is committed as failed and the model sees the error", async () => {
  const c = new Client(server.url);
  const to = `ops-${uid()}@example.com`;
  const send = ledgerTool(tool({
    description: "Send an email",
    inputSchema: z.object({ to: z.string() }),
    execute: async () => { throw new Error("SMTP 550 mailbox unavailable"); },
  }), { client: c, tool: "mail.send" });
  const res = await generateText({ model: scripted(call("call-f", "send", { to })), tools: { send }, prompt: "mail", stopWhen: stepCountIs(3) });
  const errors = res.steps.flatMap((s) => s.content).filter((p) => p.type === "tool-error");
  assert.equal(errors.length, 1);
  assert.match(String(errors[0].error), /SMTP 550/);
  assert.equal(await keyState(server.url, deriveKey("mail.send", { to })), "failed");
});

test("a held call is an SDK tool-approval-request and runs once a person approves it in the ledger", async () => {
  const c = new Client(server.url);
  const amount = 1000 + Math.floor(Math.random() * 1e6);
  let ran = 0;
  const asks = [];
  const charge = ledgerTool(tool({
    description: "Charge a card",
    inputSchema: z.object({ amount: z.number() }),
    execute: async ({ amount }) => ({ charge: `ch_${amount}`, n: ++ran }),
  }), { client: c, tool: "payments.charge", approvalWaitMs: 30_000, onApprovalRequired: (e) => asks.push(e) });

  const prompt = [{ role: "user", content: "charge it" }];
  const first = await generateText({ model: scripted(call("call-a", "charge", { amount })), tools: { charge }, messages: prompt, stopWhen: stepCountIs(3) });
  const requests = first.content.filter((p) => p.type === "tool-approval-request");
  assert.equal(requests.length, 1, "the SDK stops and asks");
  assert.equal(ran, 0);
  assert.equal(asks.length, 1);
  assert.match(asks[0].url, new RegExp(`/ui/#approvals/${asks[0].seq}$`));
  assert.ok((await pendingAsks(server.url)).some((a) => a.seq === asks[0].seq), "the ledger holds the ask for a person");

  // The app passes the SDK's approval on; the call waits for the person's
  // answer in the ledger, then runs once.
  const messages = [...prompt, ...first.response.messages,
    { role: "tool", content: [{ type: "tool-approval-response", approvalId: requests[0].approvalId, approved: true }] }];
  const second = generateText({ model: scripted(text("charged")), tools: { charge }, messages, stopWhen: stepCountIs(3) });
  assert.equal(ran, 0);
  ledgerctl("approvals", "approve", String(asks[0].seq), "--server", server.url, "--note", "ok");
  const res = await second;
  assert.equal(ran, 1);
  assert.deepEqual(approvedOutputs(res), [{ charge: `ch_${amount}`, n: 1 }]);
  const key = deriveKey("payments.charge", { amount });
  assert.equal(await keyState(server.url, key), "succeeded");

  // The same call again: the recorded result, without asking anyone (a
  // replay needs no approval) and without running again.
  const again = await generateText({ model: scripted(call("call-b", "charge", { amount })), tools: { charge }, prompt: "again", stopWhen: stepCountIs(3) });
  assert.equal(again.content.filter((p) => p.type === "tool-approval-request").length, 0);
  assert.deepEqual(again.steps[0].toolResults.map((r) => r.output), [{ charge: `ch_${amount}`, n: 1 }]);
  assert.equal(ran, 1);
  assert.equal(asks.length, 1);
});
