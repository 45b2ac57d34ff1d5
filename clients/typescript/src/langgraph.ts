/**
 * @effect-ledger/client/langgraph: the ledger on LangGraph.js's tool node.
 *
 * `ledgerToolNode(tools, { client })` is the prebuilt `ToolNode` over the
 * tools, each run once per call of the ledger: the model's tool-call id
 * is the execution, the key is derived from the tool and its input (the
 * same call made twice runs once, the second gets the recorded result),
 * a failure is committed as failed. When the namespace's policy sends a
 * tool to a person, the ledger records the ask (onApprovalRequired gets
 * its page) and the tool calls LangGraph's `interrupt()` with
 * `{ type: "ledger_approval", tool, key, seq, url, expiresAt }`: the graph
 * (compiled with a checkpointer) pauses; a person approves in the
 * ledger; resuming with `new Command({ resume: … })` runs the call once,
 * consuming the approval (a rejection is the tool's error).
 */

import { interrupt } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { tool, type StructuredToolInterface, type ToolRunnableConfig } from "@langchain/core/tools";
import { LedgerGate, type LedgerToolOptions } from "./gate.js";

export type { LedgerToolOptions } from "./gate.js";

/** The options of ledgerTools: those of one tool, and the ledger tool name of each (default its own name). */
export interface LedgerToolsOptions extends Omit<LedgerToolOptions, "tool"> {
  toolName?: (name: string) => string;
}

/** What a paused graph's interrupt carries for a call that awaits a person's approval. */
export interface LedgerApprovalInterrupt {
  type: "ledger_approval";
  tool: string;
  key: string;
  seq: number;
  url: string;
  expiresAt: number;
}

/** The tools, each run through the ledger. */
export function ledgerTools(tools: StructuredToolInterface[], options: LedgerToolsOptions): StructuredToolInterface[] {
  return tools.map((t) => {
    const name = options.toolName ? options.toolName(t.name) : t.name;
    const gate = new LedgerGate({ ...options, tool: name }, name);
    return tool(async (input: unknown, config: ToolRunnableConfig) => {
      const callId = config.toolCall?.id ?? "";
      if (await gate.needsApproval(input, callId)) {
        const ask = gate.ask(callId);
        interrupt<LedgerApprovalInterrupt, unknown>({ type: "ledger_approval", tool: name,
          key: ask?.key ?? (await gate.key(input, callId)),
          seq: ask?.seq ?? 0, url: ask?.url ?? "", expiresAt: ask?.expiresAt ?? 0 });
      }
      return gate.execute(input, callId, () => t.invoke(input as never, { ...config, toolCall: undefined }), config.signal);
    }, { name: t.name, description: t.description, schema: t.schema as never }) as unknown as StructuredToolInterface;
  });
}

/** LangGraph's prebuilt ToolNode over ledgerTools(tools, options). */
export function ledgerToolNode(tools: StructuredToolInterface[], options: LedgerToolsOptions,
  nodeOptions?: ConstructorParameters<typeof ToolNode>[1]): ToolNode {
  return new ToolNode(ledgerTools(tools, options), nodeOptions);
}
