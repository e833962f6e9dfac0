// The aggregator's specs as a device uses them: each checked against its fingerprint and q (a spec
// this SDK does not reproduce is left out, and its metric's reports are dropped as unknown: they
// would be refused or wrong), with its design; a part of a numeric metric also against the name
// and labels its numeric spec derives; a round of a strings metric also against its name, with
// its k and design derived from its parents and buckets.

import { designSpec, fingerprint } from "./canonical.js";
import { design, type Design } from "./mechanism.js";
import { checkNumeric, numericLabels, partName, type Numeric, type NumericPart } from "./numeric.js";
import { candidateCount, checkStrings, HASHED, hashedDesign, roundName, type Strings } from "./strings.js";
import type { SpecsAnswer } from "./transport.js";

/** A metric as fetched: its spec, checked against its fingerprint, and its design. */
export interface Metric {
  name: string;
  labels: string[];
  fingerprint: string;
  periodSeconds: number;
  /** The granularity (seconds) of when a report was made (UploadRequest.made_unix): the spec's
   * time_resolution_seconds, or its period when not said (a revision-1 aggregator). */
  timeResolutionSeconds: number;
  reportsPerPeriod: number;
  /** epsilon per period and per lifetime the operator allows (periodBudget null: the period's reports
   * are its only bound; lifetimeBudget Infinity: no lifetime cap). */
  periodBudget: number | null;
  lifetimeBudget: number;
  design: Design;
  /** Set for a part of a numeric metric: how a number becomes one of its categories. */
  numeric?: Numeric;
  /** Set for a round of a strings metric (design: hashed; labels: none). */
  strings?: Strings;
  /** strings: the fingerprint of the round's design (designSpec), its memo keys' design. */
  memoDesign?: string;
}

const MECHANISM_NAMES: Record<string, string> = {
  SUBSET: "subset", RAPPOR: "rappor", RAPPOR_ADMISSIBLE: "rappor-admissible", KRR: "krr", WARNER: "warner",
  HASHED,
};
const PART_NAMES: Record<string, NumericPart> = { NUMERIC_MEAN: "mean", NUMERIC_DISTRIBUTION: "distribution" };

/** MetricSpec.numeric in proto3 JSON (fields at their default are absent), checked; undefined for
 * a metric of categories; throws for a part this SDK does not know or reproduce. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
function numericOf(s: any): Numeric | undefined {
  const n = s.numeric;
  if (n === undefined || n === null) return undefined;
  const numeric = checkNumeric({ metric: n.metric ?? "", part: PART_NAMES[n.part], low: Number(n.low ?? 0),
    high: Number(n.high ?? 0), boundaries: (n.boundaries ?? []).map(Number), levels: Number(n.levels ?? 0) });
  const labels: string[] = s.labels ?? [];
  const derived = numericLabels(numeric);
  if (s.name !== partName(numeric) || labels.length !== derived.length || labels.some((l, i) => l !== derived[i])
    || (numeric.part === "mean" && s.mechanism !== "KRR")) {
    throw new RangeError(`${s.name} is not named, labelled or randomized as its numeric part says.`);
  }
  return numeric;
}

/** MetricSpec.strings in proto3 JSON (parents as base64, fields at their default absent), checked
 * and its parents sorted; undefined for any other metric; throws for a round this SDK cannot use. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
function stringsOf(s: any): Strings | undefined {
  const r = s.strings;
  if (r === undefined || r === null) return undefined;
  const parents = (r.parents ?? []).map((p: string) => Uint8Array.from(atob(p), (c) => c.charCodeAt(0)));
  const strings = checkStrings({ metric: r.metric ?? "", round: Number(r.round ?? 0), rounds: Number(r.rounds ?? 0),
    buckets: Number(r.buckets ?? 0), parents });
  if (s.name !== roundName(strings.metric, strings.round) || (s.labels ?? []).length > 0) {
    throw new RangeError(`${s.name} is not named as its strings round says, or lists labels.`);
  }
  return strings;
}

/** The metrics of an answer whose fingerprints this SDK reproduces, the largest batch allowed, and
 * the names of the specs it does not (with the numeric or strings metric each belongs to). */
export function parseSpecs(answer: SpecsAnswer): { metrics: Metric[]; maxBatch: number; refused: string[] } {
  const metrics: Metric[] = [];
  const refused: string[] = [];
  for (const s of answer.specs ?? []) {
    let metric: Metric | null = null;
    try {
      metric = metricOf(s);
    } catch {
      // a spec this SDK cannot use (e.g. a mechanism it does not know) is left out
    }
    if (metric !== null) metrics.push(metric);
    else refused.push(String(s.name), ...[s.numeric?.metric, s.strings?.metric].filter((m) => typeof m === "string"));
  }
  return { metrics, maxBatch: Number(answer.maxBatch) || 0, refused };
}

/** A served spec (proto3 JSON) as a Metric; null (or a throw) when this SDK does not reproduce it. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
function metricOf(s: any): Metric | null {
  const mechanism = MECHANISM_NAMES[s.mechanism];
  const periodSeconds = s.periodSeconds || 86400;
  const reportsPerPeriod = s.reportsPerPeriod || 1;
  const labels: string[] = s.labels ?? [];
  const epsilon = Number(s.epsilon);
  if (!mechanism) return null;
  const numeric = numericOf(s);
  const strings = stringsOf(s);
  if ((strings !== undefined) !== (mechanism === HASHED)) return null;  // a hashed design is a strings round's
  const k = strings ? candidateCount(strings) : labels.length;
  const canonical = { name: s.name, labels, mechanism, k, epsilon, period: periodSeconds, reportsPerPeriod, numeric,
    strings };
  const mine = fingerprint(canonical);
  if (mine !== s.fingerprint) return null;
  const d = strings ? hashedDesign(k, epsilon, strings.buckets) : design(mechanism, k, epsilon);
  if ((Number(s.q) || 0) !== d.q) return null;  // a q this SDK does not compute: its reports would be wrong
  return { name: s.name, labels, fingerprint: mine, periodSeconds, reportsPerPeriod,
    timeResolutionSeconds: Number(s.timeResolutionSeconds) || periodSeconds,
    periodBudget: Number(s.periodBudget) || null,
    lifetimeBudget: Number(s.lifetimeBudget) || Infinity, design: d, ...(numeric ? { numeric } : {}),
    ...(strings ? { strings, memoDesign: fingerprint(designSpec(canonical)) } : {}) };
}

/** The aggregator's clock as its last specs answer said it, moved on by the monotonic time since
 * (performance.now()): the ledger bounds the device's clock by it. */
export class ServerClock {
  private said: { unixMs: number; at: number } | null = null;

  /** An answer's server_time_unix (seconds; absent or 0: not said). */
  heard(serverTimeUnix: string | number | undefined): void {
    const unix = Number(serverTimeUnix ?? 0);
    if (Number.isFinite(unix) && unix > 0) this.said = { unixMs: unix * 1000, at: performance.now() };
  }

  /** The aggregator's time (Unix milliseconds) when its last answer of this run (full or unchanged)
   * confirmed the specs held; null until one said it. */
  answeredMs(): number | null {
    return this.said === null ? null : this.said.unixMs;
  }

  /** The aggregator's time now, Unix milliseconds; null until an answer of this run said it. */
  nowMs(): number | null {
    return this.said === null ? null : this.said.unixMs + (performance.now() - this.said.at);
  }
}
