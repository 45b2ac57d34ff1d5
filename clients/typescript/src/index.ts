/**
 * @effect-ledger/client: a client of the effect ledger for tool gateways.
 *
 * `Client.do` wraps one side effect: it reserves the effect's idempotency
 * key, runs the effect with it and commits the outcome; a repeat of an
 * effect that already succeeded gets the recorded result back without
 * running again. The same surface as the Go client (client/) and the
 * Python client (effect_ledger), and the same derived keys.
 */
export { Client, sleep } from "./client.js";
export type {
  Approval,
  ApprovalPage,
  ApprovalState,
  ApprovalUse,
  Changed,
  ClientOptions,
  CommitResult,
  Decision,
  DerivationKey,
  DoResult,
  Effect,
  EffectClass,
  EffectFunction,
  EffectView,
  KeyState,
  NotAppliedRef,
  Outcome,
  Policy,
  PolicyRule,
  PolicyState,
  Renewal,
  Reservation,
  ReserveRequest,
} from "./client.js";
export type { Reconciled, Reconciliation, ReconcileFunction } from "./reconcile.js";
export { canonicalJSON, deriveKey, deriveKeyWith, fingerprint, DERIVED_KEY_PREFIX, DERIVED_KEY2_PREFIX } from "./canonical.js";
export * from "./errors.js";
export { parseRetryAfter } from "./transport.js";
export type { TransportOptions } from "./transport.js";
