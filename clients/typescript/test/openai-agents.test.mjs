// The OpenAI Agents SDK for JavaScript (the real @openai/agents package,
// pinned in package-lock.json) with a scripted Model of its Model
// interface — no network, tracing off — and tools made by ledgerTool,
// against a real ledgerd.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Agent, run, setTracingDisabled, Usage } from "@openai/agents";
import { z } from "zod";
import { Client, deriveKey } from "../dist/index.js";
import { ledgerTool } from "../dist/openai-agents.js";
import { uid } from "./ledgerd.mjs";
import { gatedLedgerd, keyState, pendingAsks } from "./frameworks.mjs";

setTracingDisabled(true);
const server = gatedLedgerd();

/** A Model that answers each request with the next scripted output, then a final message. */
class ScriptedModel {
  constructor(...steps) {
    this.steps = steps;
  }
  async getResponse() {
    return { usage: new Usage(), output: this.steps.shift() ?? [message("done")], responseId: "resp_" + uid() };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse() {
    throw new Error("the scripted model does not stream");
  }
}
const call = (callId, name, args) => [{ type: "function_call", id: "fc_" + callId, callId, name, arguments: JSON.stringify(args), status: "completed" }];
const message = (text) => ({ type: "message", id: "msg_" + uid(), role: "assistant", status: "completed", content: [{ type: "output_text", text }] });

test("the same tool called twice runs once; the second call gets the recorded result", async () => {
  const c = new Client(server.url);
  const order = uid();
  let ran = 0;
  const refund = ledgerTool({
    name: "refund", description: "Refund an order", parameters: z.object({ order: z.string() }),
    execute: async ({ order }) => JSON.stringify({ refund: `re_${order}`, n: ++ran }),
  }, { client: c, tool: "payments.refund" });
  const agent = new Agent({ name: "ops", instructions: "refund", tools: [refund],
    model: new ScriptedModel(call("call-1", "refund", { order }), call("call-2", "refund", { order })) });
  const res = await run(agent, "refund it twice");
  assert.equal(ran, 1);
  const outputs = res.newItems.filter((i) => i.type === "tool_call_output_item").map((i) => i.output);
  assert.deepEqual(outputs, [JSON.stringify({ refund: `re_${order}`, n: 1 }), JSON.stringify({ refund: `re_${order}`, n: 1 })]);
  const key = deriveKey("payments.refund", { order });
  const receipts = (await (await fetch(`${server.url}/v1/effects/${key}`)).json()).receipts;
  assert.deepEqual(receipts.map((r) => [r.kind, r.execution_id]), [["reserve", "call-1"], ["commit", "call-1"], ["replay", "call-2"]],
    "the callId is the execution");
});

test("a failure is committed as failed and the model reads the error", async () => {
  const c = new Client(server.url);
  const to = `ops-${uid()}@example.com`;
  let ran = 0;
  const send = ledgerTool({
    name: "send", description: "Send an email", parameters: z.object({ to: z.string() }),
    execute: async () => { ran++; throw new Error("SMTP 550 mailbox unavailable"); },
  }, { client: c, tool: "mail.send" });
  const agent = new Agent({ name: "ops", instructions: "mail", tools: [send],
    model: new ScriptedModel(call("call-f", "send", { to }), call("call-g", "send", { to })) });
  const res = await run(agent, "mail");
  const outputs = res.newItems.filter((i) => i.type === "tool_call_output_item").map((i) => String(i.output));
  assert.equal(outputs.length, 2, "the model reads an error for each call");
  assert.equal(await keyState(server.url, deriveKey("mail.send", { to })), "failed");
  assert.equal(ran, 1, "the recorded failure is not retried blindly (retry_not_allowed)");
});

test("needsApproval is the ledger's policy: the run stops, a person approves in the ledger, the call runs once", async () => {
  const c = new Client(server.url);
  const amount = 1000 + Math.floor(Math.random() * 1e6);
  let ran = 0;
  const asks = [];
  const charge = ledgerTool({
    name: "charge", description: "Charge a card", parameters: z.object({ amount: z.number() }),
    execute: async ({ amount }) => `ch_${amount} #${++ran}`,
  }, { client: c, tool: "payments.charge", approvalWaitMs: 30_000, onApprovalRequired: (e) => asks.push(e) });
  const refund = ledgerTool({
    name: "refund", description: "Refund", parameters: z.object({ order: z.string() }), execute: async () => "ok",
  }, { client: c, tool: "payments.refund" });
  assert.equal(await refund.needsApproval({}, { order: "x" }, "call-r"), false, "an ungated tool needs no approval");

  const agent = new Agent({ name: "ops", instructions: "charge", tools: [charge],
    model: new ScriptedModel(call("call-a", "charge", { amount }), [message("charged")]) });
  const first = await run(agent, "charge it");
  assert.equal(first.interruptions.length, 1, "the run stops for approval");
  assert.equal(ran, 0);
  assert.equal(asks.length, 1);
  assert.ok((await pendingAsks(server.url)).some((a) => a.seq === asks[0].seq));

  // A person approves in the ledger (the REST route the page uses); the
  // app approves the interruption and resumes: the call runs once.
  const r = await fetch(`${server.url}/v1/approvals/${asks[0].seq}`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ decision: "approve", note: "ok" }) });
  assert.equal(r.status, 201, await r.text());
  first.state.approve(first.interruptions[0]);
  const second = await run(agent, first.state);
  assert.equal(ran, 1);
  assert.equal(second.finalOutput, "charged");
  assert.deepEqual(second.newItems.filter((i) => i.type === "tool_call_output_item").map((i) => i.output), [`ch_${amount} #1`]);
  assert.equal(await keyState(server.url, deriveKey("payments.charge", { amount })), "succeeded");
});
