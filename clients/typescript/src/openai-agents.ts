/**
 * @effect-ledger/client/openai-agents: the ledger on the OpenAI Agents
 * SDK's function tools.
 *
 * `ledgerTool({ name, description, parameters, execute }, { client })`
 * is the SDK's `tool(…)` whose execute runs once per call of the ledger:
 * the model's callId is the execution, the key is derived from the tool
 * and its input (the same call made twice runs once, the second gets
 * the recorded result), a failure is committed as failed. Its
 * `needsApproval` is the namespace's policy: when the policy sends the
 * tool to a person, the run stops with an interruption and the ledger
 * records the ask (onApprovalRequired gets its page); a person approves
 * in the ledger, the app approves the interruption
 * (`result.state.approve(item)`) and resumes, and the tool runs once,
 * consuming the ledger's approval.
 */

import { tool } from "@openai/agents";
import { LedgerGate, type LedgerToolOptions } from "./gate.js";

export type { LedgerToolOptions } from "./gate.js";

type ToolOptions = Parameters<typeof tool>[0];

/** The SDK's tool(options), run through the ledger; the ledger tool name defaults to options.name. */
export function ledgerTool(options: ToolOptions, ledger: LedgerToolOptions): ReturnType<typeof tool> {
  const execute = options.execute as (input: unknown, ctx?: unknown, details?: { toolCall?: { callId?: string }; signal?: AbortSignal }) => unknown;
  const name = ledger.tool ?? options.name ?? execute.name;
  if (!name) throw new TypeError("ledgerTool: give the tool a name");
  const gate = new LedgerGate(ledger, name);
  const own = options.needsApproval;
  return tool({
    ...options,
    needsApproval: async (ctx: any, input: unknown, callId?: string) => {
      if (own === true) return true;
      if (typeof own === "function" && (await own(ctx, input as any, callId))) return true;
      return gate.needsApproval(input, callId ?? "");
    },
    execute: (input: unknown, ctx?: unknown, details?: { toolCall?: { callId?: string }; signal?: AbortSignal }) =>
      gate.execute(input, details?.toolCall?.callId ?? "", async () => execute(input, ctx, details), details?.signal),
  } as ToolOptions);
}
