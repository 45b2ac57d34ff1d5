// The part every agent-framework integration shares (ai.ts,
// openai-agents.ts, langgraph.ts): a tool call becomes one effect of the
// ledger, executed under the call's own id, and the namespace's policy
// answers whether the call needs a person's approval (contract §13).

import { ApprovalRequiredError, UnknownKeyError } from "./errors.js";
import type { Client, Effect, EffectClass, Policy, Reservation } from "./client.js";

/** How a framework's tool is recorded in the ledger. */
export interface LedgerToolOptions {
  /** The ledger client (its token needs the writer role, and reader to read the policy). */
  client: Client;
  /** The ledger tool name, 1–128 bytes of visible ASCII; default the framework tool's name. */
  tool?: string;
  /** Its class; default "write". */
  effect?: EffectClass;
  /** The tool dedupes downstream (it passes the key on): an interrupted call may be taken over. */
  idempotent?: boolean;
  /**
   * The idempotency key of a call; default derived from the tool and its input as do() derives it, so the
   * same tool called twice with the same input runs once and the second
   * call gets the recorded result.
   */
  key?: (input: unknown) => string;
  /** How long a reservation holds the key while the tool runs (ms); default the ledger's. */
  leaseMs?: number;
  /**
   * How long an approved call (approved in the framework) waits for the
   * person's answer in the ledger before it fails with
   * ApprovalRequiredError; default the client's approvalWaitMs.
   */
  approvalWaitMs?: number;
  /** What the approver reads as the agent's account of the call; default the tool and its input. */
  summary?: (input: unknown) => string;
  /** Called when the ledger records an ask for a call: show the person err.url. */
  onApprovalRequired?: (err: ApprovalRequiredError) => void;
}

/** Runs a framework's tool calls through the ledger. */
export class LedgerGate {
  private readonly early = new Map<string, Reservation | ApprovalRequiredError>();

  constructor(
    private readonly o: LedgerToolOptions,
    readonly tool: string,
  ) {}

  /** The effect of one call. */
  effect(input: unknown, callId: string, signal?: AbortSignal): Effect {
    const o = this.o;
    return {
      tool: this.tool, effect: o.effect ?? "write", input: input ?? null, key: o.key?.(input), idempotent: o.idempotent,
      executionId: callId, sendInput: true, leaseMs: o.leaseMs, approvalWaitMs: o.approvalWaitMs, signal,
      approvalSummary: truncate(o.summary ? o.summary(input) : `${this.tool} ${JSON.stringify(input ?? null)}`, 1024),
    };
  }

  /**
   * Whether the call needs a person's approval: the namespace's policy
   * sends the tool to approval, and the call has not already run (a
   * replay needs none). The answer stays the same until the call runs, as
   * frameworks that ask again before they execute an approved call
   * expect. Unless the ledger already holds an approval for the call, it
   * reserves the call, so that the ledger records the ask a person
   * answers (onApprovalRequired gets its page); what that reserve
   * returned is kept for execute.
   */
  async needsApproval(input: unknown, callId: string): Promise<boolean> {
    const c = this.o.client;
    if (!approvalRequired((await c.policy()).policy, this.tool, this.o.effect ?? "write")) return false;
    const req = await c.reserveRequest(this.effect(input, callId));
    const state = await c.getEffect(req.key!).then((v) => v.state, (err) => {
      if (err instanceof UnknownKeyError) return "unknown";
      throw err;
    });
    if (state === "succeeded") return false;
    if (state === "approved" || state === "reserved") return true; // execute consumes the approval, or waits
    try {
      const rsv = await c.reserve(req);
      this.early.set(callId, rsv);
      return rsv.status !== "replayed";
    } catch (err) {
      if (err instanceof ApprovalRequiredError) {
        this.early.set(callId, err);
        this.o.onApprovalRequired?.(err);
      }
      return true; // a refusal: execute decides again, and throws it
    }
  }

  /** The idempotency key of the call (derived as do() derives it when the options give no key function). */
  async key(input: unknown, callId: string): Promise<string> {
    return (await this.o.client.reserveRequest(this.effect(input, callId))).key!;
  }

  /** The ask the ledger recorded for the call, when needsApproval made one. */
  ask(callId: string): ApprovalRequiredError | undefined {
    const early = this.early.get(callId);
    return early instanceof ApprovalRequiredError ? early : undefined;
  }

  /**
   * Runs fn once for the call's key and returns its result, or the
   * recorded result of an earlier call; a failure of fn is committed as
   * failed and thrown. A call that awaits approval waits for the answer
   * (approvalWaitMs).
   */
  async execute(input: unknown, callId: string, fn: () => unknown, signal?: AbortSignal): Promise<unknown> {
    const early = this.early.get(callId);
    this.early.delete(callId);
    const run = async () => ({ result: await fn() });
    if (early && !(early instanceof ApprovalRequiredError)) {
      return (await this.o.client.run(early, run, signal)).result;
    }
    return (await this.o.client.do(this.effect(input, callId, signal), run)).result;
  }
}

/** Whether policy sends calls of tool (of class effect) to a person: its first matching rule that sets approval says "required". */
export function approvalRequired(policy: Policy, tool: string, effect: EffectClass): boolean {
  for (const r of policy.rules ?? []) {
    if (!globMatch(r.tool, tool) || (r.effect && r.effect !== effect)) continue;
    if (r.approval !== undefined) return r.approval === "required";
  }
  return false;
}

/** Matches name against a policy glob: * any bytes, ? one, […] a class, \ escapes. */
export function globMatch(pattern: string, name: string): boolean {
  let re = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "*") re += "[\\s\\S]*";
    else if (c === "?") re += "[\\s\\S]";
    else if (c === "\\" && i + 1 < pattern.length) re += escape(pattern[++i]!);
    else if (c === "[" && pattern.indexOf("]", i + 2) > 0) {
      const end = pattern.indexOf("]", i + 2);
      let cls = pattern.slice(i + 1, end);
      if (cls[0] === "!") cls = "^" + cls.slice(1);
      re += "[" + cls.replace(/\\/g, "\\\\") + "]";
      i = end;
    } else re += escape(c);
  }
  return new RegExp("^" + re + "$").test(name);
}

function escape(c: string): string {
  return c.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}

function truncate(s: string, n: number): string {
  const b = Buffer.from(s);
  if (b.length <= n) return s;
  return b.subarray(0, n - 3).toString("utf8").replace(/\uFFFD$/, "") + "…";
}
