// Specs and uploads over the aggregator's HTTP listener (docs/protocol.md, section 5): fetch
// with keepalive, in Node >= 20 and browsers alike.

import { fingerprint } from "./canonical.js";
import { uploadJson } from "./encode.js";
import { design, type Design } from "./mechanism.js";

/** A metric as fetched: its spec, checked against its fingerprint, and its design. */
export interface Metric {
  name: string;
  labels: string[];
  fingerprint: string;
  periodSeconds: number;
  reportsPerPeriod: number;
  design: Design;
}

export interface Endpoint {
  /** e.g. "https://veil.example.com:8080" */
  url: string;
  token?: string;
}

const MECHANISM_NAMES: Record<string, string> = {
  SUBSET: "subset", RAPPOR: "rappor", RAPPOR_ADMISSIBLE: "rappor-admissible", KRR: "krr", WARNER: "warner",
};

function headers(endpoint: Endpoint, extra: Record<string, string> = {}): Record<string, string> {
  return endpoint.token ? { Authorization: `Bearer ${endpoint.token}`, ...extra } : extra;
}

/** The aggregator's specs (GET /v1/specs), each checked against its fingerprint: a spec whose
 * fingerprint this SDK does not reproduce is left out (its reports would be refused or wrong). */
export async function fetchSpecs(endpoint: Endpoint): Promise<{ metrics: Metric[]; maxBatch: number }> {
  const response = await fetch(`${endpoint.url}/v1/specs`, { headers: headers(endpoint), keepalive: true });
  if (!response.ok) throw new Error(`GET /v1/specs answered ${response.status}`);
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const body: any = await response.json();
  const metrics: Metric[] = [];
  for (const s of body.specs ?? []) {
    const mechanism = MECHANISM_NAMES[s.mechanism];
    const periodSeconds = s.periodSeconds || 86400;
    const reportsPerPeriod = s.reportsPerPeriod || 1;
    const labels: string[] = s.labels ?? [];
    if (!mechanism) continue;
    const mine = await fingerprint({ name: s.name, labels, mechanism, k: labels.length, epsilon: s.epsilon,
      period: periodSeconds, reportsPerPeriod });
    if (mine !== s.fingerprint) continue;
    metrics.push({ name: s.name, labels, fingerprint: mine, periodSeconds, reportsPerPeriod,
      design: design(mechanism, labels.length, s.epsilon) });
  }
  return { metrics, maxBatch: body.maxBatch ?? 0 };
}

export interface UploadResult {
  status: number;
  accepted: number;
  duplicate: boolean;
}

/** POST one batch; on 429, 503 or a network error, retry the same bytes (batch id included)
 * after a backoff with full jitter, never sooner than the aggregator's retry-after-ms. */
export async function uploadBatch(endpoint: Endpoint, metric: Metric, reports: readonly (readonly number[])[],
                                  options: { attempts?: number; initialMs?: number; maxMs?: number } = {}):
  Promise<UploadResult> {
  const batchId = globalThis.crypto.getRandomValues(new Uint8Array(16));
  const body = JSON.stringify(uploadJson(metric.design, metric.name, metric.fingerprint, reports, batchId));
  const attempts = options.attempts ?? 8;
  const initial = options.initialMs ?? 1000;
  const max = options.maxMs ?? 60_000;
  let status = 0;
  for (let attempt = 0; attempt < attempts; attempt++) {
    let hint = 0;
    try {
      const response = await fetch(`${endpoint.url}/v1/upload`, {
        method: "POST", body, keepalive: body.length < 60_000,
        headers: headers(endpoint, { "Content-Type": "application/json" }),
      }).catch(() => null);
      if (response !== null) {
        status = response.status;
        if (status === 200) {
          // eslint-disable-next-line @typescript-eslint/no-explicit-any
          const answer: any = await response.json();
          return { status, accepted: answer.accepted, duplicate: answer.duplicate };
        }
        if (status !== 429 && status !== 503) return { status, accepted: 0, duplicate: false };
        hint = Math.min(Number(response.headers.get("retry-after-ms") ?? 0) || 0, 300_000);
      }
    } catch {
      // a network error: retried like a 503
    }
    const backoff = Math.random() * Math.min(max, initial * 2 ** attempt);
    await new Promise((resolve) => setTimeout(resolve, Math.max(backoff, hint)));
  }
  return { status, accepted: 0, duplicate: false };
}
