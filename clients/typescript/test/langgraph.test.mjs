// LangGraph.js (the real @langchain/langgraph and @langchain/core,
// pinned in package-lock.json): a graph of a scripted model node and the
// tool node ledgerToolNode makes — no network — against a real ledgerd.
// The model node plays its script with messages of @langchain/core (its
// fake chat models answer one fixed response, so they cannot script a
// tool call followed by another).

import { test } from "node:test";
import assert from "node:assert/strict";
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { toolsCondition } from "@langchain/langgraph/prebuilt";
import { AIMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { z } from "zod";
import { Client, deriveKey } from "../dist/index.js";
import { ledgerToolNode } from "../dist/langgraph.js";
import { ledgerctl, uid } from "./ledgerd.mjs";
import { gatedLedgerd, keyState, pendingAsks } from "./frameworks.mjs";

const server = gatedLedgerd();

const call = (id, name, args) => new AIMessage({ content: "", tool_calls: [{ id, name, args, type: "tool_call" }] });

/** A graph: the scripted model, then the ledger's tool node while the model calls tools. */
function graph(tools, options, ...script) {
  return new StateGraph(MessagesAnnotation)
    .addNode("model", async () => ({ messages: [script.shift() ?? new AIMessage("done")] }))
    .addNode("tools", ledgerToolNode(tools, options))
    .addEdge(START, "model")
    .addConditionalEdges("model", toolsCondition, ["tools", END])
    .addEdge("tools", "model")
    .compile({ checkpointer: new MemorySaver() });
}

const toolOutputs = (state) => state.messages.filter((m) => m.getType() === "tool").map((m) => m.content);

test("the same tool called twice runs once; the second call gets the recorded result", async () => {
  const order = uid();
  let ran = 0;
  const refund = tool(async ({ order }) => `re_${order} #${++ran}`, { name: "refund", description: "Refund", schema: z.object({ order: z.string() }) });
  const g = graph([refund], { client: new Client(server.url), toolName: (n) => `payments.${n}` },
    call("tc-1", "refund", { order }), call("tc-2", "refund", { order }));
  const out = await g.invoke({ messages: [{ role: "user", content: "refund twice" }] }, { configurable: { thread_id: uid() } });
  assert.equal(ran, 1);
  assert.deepEqual(toolOutputs(out), [`re_${order} #1`, `re_${order} #1`]);
  const key = deriveKey("payments.refund", { order });
  const receipts = (await (await fetch(`${server.url}/v1/effects/${key}`)).json()).receipts;
  assert.deepEqual(receipts.map((r) => [r.kind, r.execution_id]), [["reserve", "tc-1"], ["commit", "tc-1"], ["replay", "tc-2"]],
    "the tool-call id is the execution");
});

test("a failure is committed as failed and the model reads the error", async () => {
  const to = `ops-${uid()}@example.com`;
  const send = tool(async () => { throw new Error("SMTP 550 mailbox unavailable"); }, { name: "send", description: "Mail", schema: z.object({ to: z.string() }) });
  const g = graph([send], { client: new Client(server.url), toolName: (n) => `mail.${n}` }, call("tc-f", "send", { to }));
  const out = await g.invoke({ messages: [{ role: "user", content: "mail" }] }, { configurable: { thread_id: uid() } });
  assert.match(String(toolOutputs(out)[0]), /SMTP 550/);
  assert.equal(await keyState(server.url, deriveKey("mail.send", { to })), "failed");
});

test("a held call pauses the graph until a person approves it in the ledger, then runs once", async () => {
  const amount = 1000 + Math.floor(Math.random() * 1e6);
  let ran = 0;
  const charge = tool(async ({ amount }) => `ch_${amount} #${++ran}`, { name: "charge", description: "Charge", schema: z.object({ amount: z.number() }) });
  const g = graph([charge], { client: new Client(server.url), toolName: (n) => `payments.${n}`, approvalWaitMs: 30_000 },
    call("tc-a", "charge", { amount }));
  const thread = { configurable: { thread_id: uid() } };
  const paused = await g.invoke({ messages: [{ role: "user", content: "charge" }] }, thread);
  const interrupts = paused.__interrupt__;
  assert.equal(interrupts?.length, 1, "the graph pauses");
  const ask = interrupts[0].value;
  assert.equal(ask.type, "ledger_approval");
  assert.equal(ask.tool, "payments.charge");
  assert.ok(ask.seq > 0 && ask.url.endsWith(`/ui/#approvals/${ask.seq}`), JSON.stringify(ask));
  assert.ok((await pendingAsks(server.url)).some((a) => a.seq === ask.seq));
  assert.equal(ran, 0);

  ledgerctl("approvals", "approve", String(ask.seq), "--server", server.url, "--note", "ok");
  const done = await g.invoke(new Command({ resume: "approved" }), thread);
  assert.equal(ran, 1);
  assert.deepEqual(toolOutputs(done), [`ch_${amount} #1`]);
  assert.equal(await keyState(server.url, deriveKey("payments.charge", { amount })), "succeeded");
});
