// How the Reporter talks to an aggregator, whatever the wire (HTTP here, gRPC in Node: grpc.ts),
// and the client rules of docs/protocol.md section 5: which answers are final, which are retried
// (the same bytes, batch id included), and the backoff.

import type { Metric } from "./specs.js";

/** A batch of randomized reports of one metric under one spec, made in one time slot, with the id
 * every attempt resends. */
export interface Batch {
  metric: Metric;
  reports: number[][];
  id: Uint8Array;
  /** Unix milliseconds when it was cut: it is given up after the retry horizon. */
  made: number;
  /** The start (Unix seconds) of the time slot its reports were made in (UploadRequest.made_unix). */
  madeUnix: number;
}

/** What an upload came to. retry: send the same batch again after the backoff, never sooner than
 * hintMs (token: the token was refused, which an operator can fix); fail: never send it again
 * (refetch: the spec is stale, fetch the specs again; tooLate: made longer ago than the aggregator
 * accepts, counted as tooLate). */
export type Outcome =
  | { kind: "ok"; accepted: number; duplicate: boolean }
  | { kind: "retry"; why: string; hintMs: number; token: boolean }
  | { kind: "fail"; why: string; refetch: boolean; tooLate: boolean };

/** The answer to an upload call: one outcome per batch, in order, and the aggregator's specs_version
 * ("" when not said). */
export interface Sent {
  outcomes: Outcome[];
  specsVersion: string;
}

/** The specs as the aggregator serves them (the proto3 JSON names of GetMetricSpecsResponse). */
export interface SpecsAnswer {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  specs?: any[];
  maxBatch?: number;
  specsVersion?: string;
  /** The version asked about is current: no specs in the answer. */
  unchanged?: boolean;
  /** The aggregator's clock (Unix seconds) when it answered; a string or a number (proto3 JSON int64). */
  serverTimeUnix?: string | number;
  maxLatenessSeconds?: number;
}

export interface Transport {
  /** "http" or "grpc", for log lines. */
  readonly kind: string;
  /** False once the aggregator answered an UploadBatches call as unknown (revision 1): from then on
   * this transport is sent one batch per upload. */
  readonly batches: boolean;
  /** The specs (unchanged when ifVersion is current); throws when they cannot be had now. */
  specs(timeoutMs: number, ifVersion?: string): Promise<SpecsAnswer>;
  /** One batch in one Upload. */
  upload(batch: Batch, timeoutMs: number): Promise<Sent>;
  /** Several batches (2 to 64) in one UploadBatches call (null: the aggregator has no such call;
   * batches is false from then on). */
  uploadBatches(batches: Batch[], timeoutMs: number): Promise<Sent | null>;
  close(): void;
}

/** gRPC status codes (the numbers of BatchResult.code). */
export const Code = {
  OK: 0, INVALID_ARGUMENT: 3, PERMISSION_DENIED: 7, FAILED_PRECONDITION: 9, OUT_OF_RANGE: 11, UNIMPLEMENTED: 12,
  UNAUTHENTICATED: 16,
} as const;

/** What a gRPC status (of a call, or a BatchResult's code) means for its batch (docs/protocol.md
 * section 5): only what can never succeed is final. */
export function outcomeOfCode(code: number, why: string, hintMs = 0): Outcome {
  if (code === Code.INVALID_ARGUMENT) return { kind: "fail", why, refetch: false, tooLate: false };
  if (code === Code.OUT_OF_RANGE) return { kind: "fail", why: `too late (${why})`, refetch: false, tooLate: true };
  if (code === Code.FAILED_PRECONDITION) return { kind: "fail", why: `stale spec (${why})`, refetch: true, tooLate: false };
  return { kind: "retry", why, hintMs, token: code === Code.UNAUTHENTICATED || code === Code.PERMISSION_DENIED };
}

/** A batch unacknowledged this long after it was made is given up (the aggregator remembers batch
 * ids for at least this long, so a later retry could count twice). */
export const RETRY_HORIZON_MS = 24 * 3600 * 1000;
/** The most of a retry hint believed. */
export const MAX_HINT_MS = 300_000;

/** Full jitter: uniform in [0, min(max, initial 2^failures)] (failures counted from 0: the first wait
 * is at most initial), or the hint when that is longer: max(hint, jittered backoff), as the Python
 * SDK waits. */
export function backoffMs(failures: number, initialMs: number, maxMs: number, hintMs = 0): number {
  const ceiling = Math.min(maxMs, initialMs * 2 ** Math.min(failures, 40));
  return Math.max(Math.random() * ceiling, Math.min(hintMs, MAX_HINT_MS));
}

/** The retry hint of an answer's `retry-after-ms` (or HTTP `Retry-After`, whole seconds). */
export function hintOf(retryAfterMs: string | null | undefined, retryAfterSeconds?: string | null): number {
  const ms = Number(retryAfterMs ?? Number.NaN);
  if (Number.isFinite(ms) && ms > 0) return Math.min(ms, MAX_HINT_MS);
  const seconds = Number(retryAfterSeconds ?? Number.NaN);
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds * 1000, MAX_HINT_MS) : 0;
}
