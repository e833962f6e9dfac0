// How the Reporter talks to an aggregator, whatever the wire (HTTP here, gRPC in Node: grpc.ts),
// and the client rules of docs/protocol.md section 5: which answers are final, which are retried
// (the same bytes, batch id included), and the backoff.

import type { Metric } from "./specs.js";

/** A batch of randomized reports of one metric under one spec, with the id every attempt resends. */
export interface Batch {
  metric: Metric;
  reports: number[][];
  id: Uint8Array;
  /** Unix milliseconds when it was made: it is given up after the retry horizon. */
  made: number;
}

/** What an upload came to. retry: send the same batch again after the backoff, never sooner than
 * hintMs (token: the token was refused, which an operator can fix); fail: never send it again
 * (refetch: the spec is stale, fetch the specs again). */
export type Outcome =
  | { kind: "ok"; accepted: number; duplicate: boolean }
  | { kind: "retry"; why: string; hintMs: number; token: boolean }
  | { kind: "fail"; why: string; refetch: boolean };

/** The specs as the aggregator serves them (the proto3 JSON names of GetMetricSpecsResponse). */
export interface SpecsAnswer {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  specs?: any[];
  maxBatch?: number;
}

export interface Transport {
  /** "http" or "grpc", for log lines. */
  readonly kind: string;
  /** The specs; throws when they cannot be had now. */
  specs(timeoutMs: number): Promise<SpecsAnswer>;
  upload(batch: Batch, timeoutMs: number): Promise<Outcome>;
  close(): void;
}

/** A batch unacknowledged this long after it was made is given up (the aggregator remembers batch
 * ids for at least this long, so a later retry could count twice). */
export const RETRY_HORIZON_MS = 24 * 3600 * 1000;
/** The most of a retry hint believed. */
export const MAX_HINT_MS = 300_000;

/** Full jitter: uniform in [0, min(max, initial 2^failures)], never sooner than the hint. */
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
