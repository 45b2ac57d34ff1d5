/**
 * @effect-ledger/client/ai: the ledger on the Vercel AI SDK's tools.
 *
 * `ledgerTool(tool({ … execute }), { client, tool: "payments.refund" })`
 * returns the same tool whose execute runs once per call of the ledger:
 * the model's toolCallId is the execution, the key is derived from the
 * tool and its input (the same call made twice runs once, the second
 * gets the recorded result), a failure is committed as failed. When the
 * namespace's policy sends the tool to a person, `needsApproval` answers
 * true and the ledger records the ask: the SDK stops with a
 * `tool-approval-request`; a person approves in the ledger (the page
 * `err.url` names, or `ledgerctl approvals approve SEQ`), the app
 * answers the request with a `tool-approval-response`, and the tool runs
 * once, consuming the ledger's approval.
 */

import type { Tool, ToolExecutionOptions } from "ai";
import { LedgerGate, type LedgerToolOptions } from "./gate.js";

export type { LedgerToolOptions } from "./gate.js";

/** Options of ledgerTool: the ledger tool name is required (an AI SDK tool has none of its own). */
export interface AIToolOptions extends LedgerToolOptions {
  tool: string;
}

/** Wraps an AI SDK tool's execute (and needsApproval) in the ledger. */
export function ledgerTool<T extends Tool<any, any>>(t: T, options: AIToolOptions): T {
  const execute = t.execute;
  if (!execute) throw new TypeError(`ledgerTool ${options.tool}: the tool has no execute`);
  const gate = new LedgerGate(options, options.tool);
  const own = t.needsApproval;
  return {
    ...t,
    needsApproval: async (input: unknown, o: { toolCallId: string; messages: any[]; experimental_context?: unknown }) => {
      if (own === true) return true;
      if (typeof own === "function" && (await own(input, o))) return true;
      return gate.needsApproval(input, o.toolCallId);
    },
    execute: (input: unknown, o: ToolExecutionOptions) =>
      gate.execute(input, o.toolCallId, async () => execute.call(t, input, o), o.abortSignal),
  } as T;
}
