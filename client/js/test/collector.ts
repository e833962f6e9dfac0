// A real HTTP collector on loopback for the SDK's tests (node:http), written from
// docs/protocol.md: GET /v1/specs (ETag, If-None-Match -> 304), POST /v1/upload and, at
// revision 2, POST /v1/uploads (one result per batch); dedupe by batch id; made_unix recorded per
// batch and checked against maxLateness (410 / OUT_OF_RANGE); fault injection per batch; parts of
// numeric metrics (revision 3) and rounds of strings metrics (revision 4, their hashed reports
// read) served as the aggregator serves them. At revision 1 it says no version nor time and
// answers /v1/uploads 404, as an older aggregator does.
import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

import {
  candidateCount, checkStrings, design, fingerprint, numericLabels, partName, roundName, ROUNDS, type Mechanism, type Numeric,
  type Strings,
} from "../src/index.js";

export interface MetricJson {
  name: string; labels: string[]; mechanism: Mechanism | "hashed"; epsilon: number; periodSeconds: number;
  reportsPerPeriod: number; timeResolutionSeconds: number; numeric?: Numeric; strings?: Strings;
}

/** The fields of an UploadRequest (proto3 JSON) the collector reads. */
interface Upload {
  batchId: string; metric: string; specFingerprint: string; count: number; madeUnix?: string; bitmaps?: { bits: string };
  indexSets?: { indices: string }; hashed?: { words: string };
}

/** A batch as it arrived; columns: its reports' bytes (bitmaps, little-endian indices or words). */
export interface Arrival {
  batchId: string; metric: string; fingerprint: string; count: number; madeUnix: number; outcome: string;
  columns: Uint8Array;
}

const WIRE_NAMES: Record<string, string> = {
  subset: "SUBSET", rappor: "RAPPOR", "rappor-admissible": "RAPPOR_ADMISSIBLE", krr: "KRR", warner: "WARNER",
  hashed: "HASHED",
};
// gRPC code -> the HTTP status of a single upload (docs/protocol.md section 5).
const HTTP_OF: Record<number, number> = { 3: 400, 9: 409, 11: 410, 8: 429, 14: 503, 13: 500 };

export function metric(name: string, mechanism: Mechanism, k: number, timeResolutionSeconds = 0): MetricJson {
  return { name, labels: Array.from({ length: k }, (_, j) => `${name}${j}`), mechanism, epsilon: 1,
    periodSeconds: 86400, reportsPerPeriod: 1_000_000, timeResolutionSeconds };
}

/** The spec of a numeric metric's part, named and labelled as its numeric spec says. */
export function numericPart(numeric: Numeric, mechanism: Mechanism, epsilon = 1): MetricJson {
  return { name: partName(numeric), labels: numericLabels(numeric), mechanism, epsilon, periodSeconds: 86400,
    reportsPerPeriod: 1_000_000, timeResolutionSeconds: 0, numeric };
}

/** The spec of a strings metric's round (named `<metric>.r<round>`; hashed, no labels; its parents
 * sorted, as the aggregator serves them). */
export function stringsRound(metric: string, round: number, buckets: number, parents: Uint8Array[], epsilon = 4,
                             periodSeconds = 86400): MetricJson {
  return { name: roundName(metric, round), labels: [], mechanism: "hashed", epsilon, periodSeconds,
    reportsPerPeriod: 1_000_000, timeResolutionSeconds: 0,
    strings: checkStrings({ metric, round, rounds: ROUNDS, buckets, parents }) };
}

/** MetricSpec.strings in proto3 JSON: parents as base64, the round left out when 0. */
export function servedStrings(s: Strings): Record<string, unknown> {
  return { metric: s.metric, ...(s.round ? { round: s.round } : {}), rounds: s.rounds, buckets: s.buckets,
    parents: s.parents.map((p) => Buffer.from(p).toString("base64")) };
}

/** MetricSpec.numeric in proto3 JSON: the part an enum name, fields at their default left out. */
export function servedNumeric(n: Numeric): Record<string, unknown> {
  return Object.fromEntries(Object.entries({ ...n, part: `NUMERIC_${n.part.toUpperCase()}` })
    .filter(([, x]) => x !== 0 && !(Array.isArray(x) && x.length === 0)));
}

export class Collector {
  revision = 2;
  /** False: POST /v1/uploads answers 404 even at revision 2 (e.g. a proxy that does not route it). */
  uploadBatches = true;
  metrics: MetricJson[] = [metric("browser", "subset", 4), metric("country", "krr", 6), metric("theme", "rappor", 3),
    metric("opt_in", "warner", 2)];
  /** The aggregator's clock, Unix seconds. */
  clock = () => Date.now() / 1000;
  maxLateness = 0;
  /** Whether GET /v1/specs answers (false: 503, an aggregator not reachable yet). */
  serving = true;
  /** gRPC codes for the next batches, in arrival order (0 or absent: counted). */
  readonly faults: number[] = [];
  readonly arrivals: Arrival[] = [];
  readonly counted = new Map<string, number>();
  /** Every POST /v1/uploads (its batch ids), and every GET /v1/specs (its If-None-Match). */
  readonly batchCalls: string[][] = [];
  readonly specRequests: (string | null)[] = [];
  notModified = 0;
  /** A q served instead of the design's, by metric (a spec the SDK must refuse). */
  readonly wrongQ = new Map<string, number>();
  private server: Server | null = null;

  get url(): string {
    return `http://127.0.0.1:${(this.server!.address() as AddressInfo).port}`;
  }

  version(): string {
    // A digest of what is served: any change (a round's parents included) is a new version.
    if (this.revision < 2) return "";
    return `v${createHash("sha256").update(JSON.stringify([this.metrics, [...this.wrongQ]])).digest("hex").slice(0, 16)}`;
  }

  async start(): Promise<void> {
    this.server = createServer((request, response) => void this.handle(request, response));
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise((resolve) => this.server?.close(resolve));
  }

  total(): number {
    return [...this.counted.values()].reduce((a, b) => a + b, 0);
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    const send = (status: number, body?: unknown, headers: Record<string, string> = {}) => {
      response.writeHead(status, { "Content-Type": "application/json", ...headers });
      response.end(body === undefined ? undefined : JSON.stringify(body));
    };
    const path = request.url ?? "";
    if (request.method === "GET" && path.startsWith("/v1/specs")) {
      this.specRequests.push(request.headers["if-none-match"] ?? null);
      if (!this.serving) return send(503, { error: "not yet", code: "UNAVAILABLE" });
      const version = this.version();
      if (version && request.headers["if-none-match"] === `"${version}"`) {
        this.notModified += 1;
        return send(304, undefined, { ETag: `"${version}"` });
      }
      return send(200, await this.specs(), version ? { ETag: `"${version}"` } : {});
    }
    if (request.method === "POST" && path === "/v1/upload") {
      const code = this.take(JSON.parse(Buffer.concat(chunks).toString()));
      if (code.code) return send(HTTP_OF[code.code] ?? 500, { error: "refused", code: String(code.code) });
      return send(200, { accepted: code.accepted, duplicate: code.duplicate, specsVersion: this.version() || undefined });
    }
    if (request.method === "POST" && path === "/v1/uploads") {
      const { batches } = JSON.parse(Buffer.concat(chunks).toString()) as { batches: Upload[] };
      this.batchCalls.push(batches.map((b) => b.batchId));
      if (this.revision < 2 || !this.uploadBatches) return send(404, { error: "no such route", code: "NOT_FOUND" });
      const results = batches.map((b) => this.take(b));
      return send(200, { results, specsVersion: this.version() });
    }
    send(404, { error: "no such route", code: "NOT_FOUND" });
  }

  private async specs(): Promise<unknown> {
    const specs = [];
    for (const m of this.metrics) {
      const k = m.strings ? candidateCount(m.strings) : m.labels.length;
      const fp = await fingerprint({ name: m.name, labels: m.labels, mechanism: m.mechanism, k,
        epsilon: m.epsilon, period: m.periodSeconds, reportsPerPeriod: m.reportsPerPeriod, numeric: m.numeric,
        strings: m.strings });
      const q = m.mechanism === "hashed" ? 0 : design(m.mechanism, k, m.epsilon).q;
      specs.push({ name: m.name, ...(m.labels.length ? { labels: m.labels } : {}), mechanism: WIRE_NAMES[m.mechanism],
        epsilon: m.epsilon, q: this.wrongQ.get(m.name) ?? q, fingerprint: fp,
        periodSeconds: m.periodSeconds,
        reportsPerPeriod: m.reportsPerPeriod,
        ...(this.revision >= 2 && m.timeResolutionSeconds ? { timeResolutionSeconds: m.timeResolutionSeconds } : {}),
        ...(m.numeric ? { numeric: servedNumeric(m.numeric) } : {}),
        ...(m.strings ? { strings: servedStrings(m.strings) } : {}) });
    }
    return this.revision < 2 ? { specs } : { specs, specsVersion: this.version(),
      serverTimeUnix: String(Math.floor(this.clock())), maxLatenessSeconds: this.maxLateness };
  }

  /** One batch: its result (code 0: counted or duplicate). */
  private take(b: Upload): { code: number;
    accepted: number; duplicate: boolean } {
    const madeUnix = Number(b.madeUnix ?? 0);
    const columns = Buffer.from(b.bitmaps?.bits ?? b.indexSets?.indices ?? b.hashed?.words ?? "", "base64");
    const arrival = (outcome: string) => this.arrivals.push({ batchId: b.batchId, metric: b.metric,
      fingerprint: b.specFingerprint, count: b.count, madeUnix, outcome, columns });
    const fault = this.faults.shift() ?? 0;
    if (fault) {
      arrival(`code ${fault}`);
      return { code: fault, accepted: 0, duplicate: false };
    }
    const m = this.metrics.find((x) => x.name === b.metric);
    if (!m) {
      arrival("unknown metric");
      return { code: 9, accepted: 0, duplicate: false };
    }
    if (this.counted.has(b.batchId)) {
      arrival("duplicate");
      return { code: 0, accepted: b.count, duplicate: true };
    }
    const resolution = m.timeResolutionSeconds || m.periodSeconds;
    if (this.revision >= 2 && madeUnix && this.maxLateness && madeUnix + resolution + this.maxLateness <= this.clock()) {
      arrival("too late");
      return { code: 11, accepted: 0, duplicate: false };
    }
    this.counted.set(b.batchId, b.count);
    arrival("counted");
    return { code: 0, accepted: b.count, duplicate: false };
  }
}
