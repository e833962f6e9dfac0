// Specs and uploads over the aggregator's HTTP listener (docs/protocol.md, section 5), with fetch
// in Node >= 20 and browsers alike: keepalive, so a batch sent as the page goes away still leaves.

import { uploadJson } from "./encode.js";
import { parseSpecs, type Metric } from "./specs.js";
import { hintOf, type Batch, type Outcome, type SpecsAnswer, type Transport } from "./transport.js";

export interface Endpoint {
  /** e.g. "https://veil.example.com:8080" */
  url: string;
  token?: string;
}

// Browsers refuse keepalive bodies above 64 KiB in flight.
const KEEPALIVE_BYTES = 60_000;

export class HttpTransport implements Transport {
  readonly kind = "http";

  constructor(private readonly endpoint: Endpoint) {}

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return this.endpoint.token ? { Authorization: `Bearer ${this.endpoint.token}`, ...extra } : extra;
  }

  async specs(timeoutMs: number): Promise<SpecsAnswer> {
    const response = await fetch(`${this.endpoint.url}/v1/specs`, { headers: this.headers(),
      signal: AbortSignal.timeout(timeoutMs) });
    if (!response.ok) throw new Error(`GET /v1/specs answered ${response.status}`);
    return await response.json() as SpecsAnswer;
  }

  async upload(batch: Batch, timeoutMs: number): Promise<Outcome> {
    const { metric, reports, id } = batch;
    const body = JSON.stringify(uploadJson(metric.design, metric.name, metric.fingerprint, reports, id));
    let response: Response;
    try {
      response = await fetch(`${this.endpoint.url}/v1/upload`, {
        method: "POST", body, keepalive: body.length < KEEPALIVE_BYTES, signal: AbortSignal.timeout(timeoutMs),
        headers: this.headers({ "Content-Type": "application/json" }),
      });
    } catch (error) {
      return { kind: "retry", why: (error as Error)?.name === "TimeoutError" ? "timeout" : "unreachable", hintMs: 0,
        token: false };
    }
    const status = response.status;
    if (status === 200) {
      try {
        const answer = await response.json() as { accepted?: number; duplicate?: boolean };
        return { kind: "ok", accepted: answer.accepted ?? 0, duplicate: answer.duplicate ?? false };
      } catch {
        return { kind: "retry", why: "unreadable answer", hintMs: 0, token: false };
      }
    }
    await response.body?.cancel().catch(() => undefined);
    if (status === 400 || status === 413) return { kind: "fail", why: `HTTP ${status}`, refetch: false };
    if (status === 409) return { kind: "fail", why: "stale spec (HTTP 409)", refetch: true };
    return { kind: "retry", why: `HTTP ${status}`, token: status === 401 || status === 403,
      hintMs: hintOf(response.headers.get("retry-after-ms"), response.headers.get("retry-after")) };
  }

  close(): void {}
}

/** The aggregator's specs (GET /v1/specs), each checked against its fingerprint. */
export async function fetchSpecs(endpoint: Endpoint, timeoutMs = 10_000): Promise<{ metrics: Metric[];
  maxBatch: number }> {
  return parseSpecs(await new HttpTransport(endpoint).specs(timeoutMs));
}
