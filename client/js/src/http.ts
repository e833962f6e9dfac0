// Specs and uploads over the aggregator's HTTP listener (docs/protocol.md, section 5), with fetch
// in Node >= 20 and browsers alike: keepalive, so a batch sent as the page goes away still leaves.
// Several batches go in one POST /v1/uploads; an aggregator older than revision 2 answers it 404
// or 405, and this transport then sends one POST /v1/upload per batch for as long as it lives.

import { uploadJson } from "./encode.js";
import { parseSpecs, type Metric } from "./specs.js";
import {
  hintOf, outcomeOfCode, type Batch, type Outcome, type Sent, type SpecsAnswer, type Transport,
} from "./transport.js";

export interface Endpoint {
  /** e.g. "https://veil.example.com:8080" */
  url: string;
  token?: string;
}

// Browsers refuse keepalive bodies above 64 KiB in flight.
const KEEPALIVE_BYTES = 60_000;

/** What an HTTP refusal means for its batches (docs/protocol.md section 5). */
function outcomeOfStatus(response: Response): Outcome {
  const status = response.status;
  // 405 and 415: a route or body this SDK never gets wrong unless it has a bug; final as 400.
  if ([400, 405, 413, 415].includes(status)) return { kind: "fail", why: `HTTP ${status}`, refetch: false, tooLate: false };
  if (status === 409) return { kind: "fail", why: "stale spec (HTTP 409)", refetch: true, tooLate: false };
  if (status === 410) return { kind: "fail", why: "too late (HTTP 410)", refetch: false, tooLate: true };
  return { kind: "retry", why: `HTTP ${status}`, token: status === 401 || status === 403,
    hintMs: hintOf(response.headers.get("retry-after-ms"), response.headers.get("retry-after")) };
}

const unreachable = (error: unknown): Outcome => ({ kind: "retry",
  why: (error as Error)?.name === "TimeoutError" ? "timeout" : "unreachable", hintMs: 0, token: false });

const body = (b: Batch) => uploadJson(b.metric.design, b.metric.name, b.metric.fingerprint, b.reports, b.id, b.madeUnix);

export class HttpTransport implements Transport {
  readonly kind = "http";
  batches = true;

  constructor(private readonly endpoint: Endpoint) {}

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return this.endpoint.token ? { Authorization: `Bearer ${this.endpoint.token}`, ...extra } : extra;
  }

  async specs(timeoutMs: number, ifVersion = ""): Promise<SpecsAnswer> {
    const response = await fetch(`${this.endpoint.url}/v1/specs`, { signal: AbortSignal.timeout(timeoutMs),
      headers: this.headers(ifVersion ? { "If-None-Match": `"${ifVersion}"` } : {}) });
    if (response.status === 304) {
      // Not modified: no body; the aggregator's clock from the Date header, when the page may read it.
      const date = Date.parse(response.headers.get("date") ?? "");
      return { unchanged: true, specsVersion: ifVersion,
        ...(Number.isFinite(date) ? { serverTimeUnix: Math.floor(date / 1000) } : {}) };
    }
    if (!response.ok) throw new Error(`GET /v1/specs answered ${response.status}`);
    return await response.json() as SpecsAnswer;
  }

  private async post(path: string, json: unknown, timeoutMs: number): Promise<Response | Outcome> {
    const text = JSON.stringify(json);
    try {
      return await fetch(`${this.endpoint.url}${path}`, {
        method: "POST", body: text, keepalive: text.length < KEEPALIVE_BYTES, signal: AbortSignal.timeout(timeoutMs),
        headers: this.headers({ "Content-Type": "application/json" }),
      });
    } catch (error) {
      return unreachable(error);
    }
  }

  async upload(batch: Batch, timeoutMs: number): Promise<Sent> {
    const response = await this.post("/v1/upload", body(batch), timeoutMs);
    if (!(response instanceof Response)) return { outcomes: [response], specsVersion: "" };
    if (response.status === 200) {
      try {
        const answer = await response.json() as { accepted?: number; duplicate?: boolean; specsVersion?: string };
        return { outcomes: [{ kind: "ok", accepted: answer.accepted ?? 0, duplicate: answer.duplicate ?? false }],
          specsVersion: answer.specsVersion ?? "" };
      } catch {
        return { outcomes: [{ kind: "retry", why: "unreadable answer", hintMs: 0, token: false }], specsVersion: "" };
      }
    }
    await response.body?.cancel().catch(() => undefined);
    return { outcomes: [outcomeOfStatus(response)], specsVersion: "" };
  }

  async uploadBatches(batches: Batch[], timeoutMs: number): Promise<Sent | null> {
    const response = await this.post("/v1/uploads", { batches: batches.map(body) }, timeoutMs);
    const all = (outcome: Outcome): Sent => ({ outcomes: batches.map(() => outcome), specsVersion: "" });
    if (!(response instanceof Response)) return all(response);
    if (response.status === 200) {
      try {
        const answer = await response.json() as { results?: { code?: number; message?: string; accepted?: number;
          duplicate?: boolean }[]; specsVersion?: string };
        const results = answer.results ?? [];
        if (results.length !== batches.length) throw new Error("a result per batch");
        return { specsVersion: answer.specsVersion ?? "", outcomes: results.map((r) => r.code
          ? outcomeOfCode(r.code, r.message || `code ${r.code}`)
          : { kind: "ok", accepted: r.accepted ?? 0, duplicate: r.duplicate ?? false }) };
      } catch {
        return all({ kind: "retry", why: "unreadable answer", hintMs: 0, token: false });
      }
    }
    await response.body?.cancel().catch(() => undefined);
    if (response.status === 404 || response.status === 405) {
      this.batches = false;
      return null;
    }
    return all(outcomeOfStatus(response));
  }

  close(): void {}
}

/** The aggregator's specs (GET /v1/specs), each checked against its fingerprint. */
export async function fetchSpecs(endpoint: Endpoint, timeoutMs = 10_000): Promise<{ metrics: Metric[];
  maxBatch: number }> {
  return parseSpecs(await new HttpTransport(endpoint).specs(timeoutMs));
}
