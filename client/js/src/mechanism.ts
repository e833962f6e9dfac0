// The mechanisms' integer thresholds and randomization (docs/protocol.md, "Mechanisms"), computed
// in exact integer arithmetic from the double epsilon, as the Python SDK computes them.

import { bernoulli, choose, type WordSource } from "./random.js";

export const MECHANISMS = ["subset", "rappor", "rappor-admissible", "krr", "warner"] as const;
export type Mechanism = (typeof MECHANISMS)[number];
export const EPSILON_RANGE: readonly [number, number] = [1e-4, 20];

const ONE64 = 1n << 64n;
const SERIES_BITS = 128n;

/** Misuse of the SDK (a bad spec, value or setting): the one error report() may throw. */
export class VeilUsageError extends RangeError {
  override name = "VeilUsageError";
}

/** A double as m * 2**e with m a BigInt (exact). */
function split(x: number): [bigint, bigint] {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const exponent = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  if (exponent === 0) return [fraction, -1074n];
  return [fraction | (1n << 52n), BigInt(exponent - 1075)];
}

function step(x: number, up: boolean): number {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  view.setBigUint64(0, view.getBigUint64(0) + (up ? 1n : -1n)); // x > 0
  return view.getFloat64(0);
}

/** A rational a / b as [a, b] with b > 0. */
type Ratio = [bigint, bigint];

function ratio(x: number): Ratio {
  const [m, e] = split(x);
  return e >= 0n ? [m << e, 1n] : [m, 1n << -e];
}

/** gamma: the largest double at most e^epsilon, from a lower bound of e^epsilon (the series in
 * 128-bit fixed point, every term rounded down). */
export function epsilonToGamma(epsilon: number): number {
  checkEpsilon(epsilon);
  const [a, b] = ratio(epsilon);
  const one = 1n << SERIES_BITS;
  let term = one;
  let total = one;
  for (let n = 1n; term > 0n; n++) {
    term = (term * a) / (b * n);
    total += term;
  }
  // Is the double g at most total / 2**128?
  const atMost = (g: number): boolean => {
    const [m, e] = split(g);
    const shift = e + SERIES_BITS;
    return shift >= 0n ? m << shift <= total : m <= total << -shift;
  };
  let gamma = Math.exp(epsilon);
  while (!atMost(gamma)) gamma = step(gamma, false);
  while (atMost(step(gamma, true))) gamma = step(gamma, true);
  return gamma;
}

export function checkEpsilon(epsilon: number): void {
  if (typeof epsilon !== "number" || !(epsilon >= EPSILON_RANGE[0] && epsilon <= EPSILON_RANGE[1])) {
    throw new VeilUsageError(`epsilon must be a number from 0.0001 to 20, not ${epsilon}.`);
  }
}

/** The minimax subset size, decided exactly on the double gamma. */
export function minimaxQ(k: number, gamma: number): number {
  const [gn, gd] = ratio(gamma);
  const K = BigInt(k);
  const low = (K * gd) / (gn + gd);
  const high = low * (gn + gd) === K * gd ? low : low + 1n;
  // f(x) - k is proportional to x (k - x) / (k + x d)^2 with d = gamma - 1 = (gn - gd) / gd.
  const dn = gn - gd;
  const left = low * (K - low) * (K * gd + high * dn) ** 2n;
  const right = high * (K - high) * (K * gd + low * dn) ** 2n;
  return Number(low >= 1n && left >= right ? low : high);
}

function isqrt(n: bigint): bigint {
  if (n < 2n) return n;
  let x = 1n << BigInt((n.toString(2).length + 1) >> 1);
  for (;;) {
    const y = (x + n / x) >> 1n;
    if (y >= x) return x;
    x = y;
  }
}

/** What a device needs to randomize one metric: its design and integer thresholds. */
export interface Design {
  /** A declared mechanism, or "hashed": a round of a strings metric (strings.ts: hashedDesign). */
  mechanism: Mechanism | "hashed";
  k: number;
  epsilon: number;
  gamma: number;
  /** Categories per report for the q-subset designs; 0 for the RAPPOR designs. */
  q: number;
  /** keep (subset, krr, warner; hashed: of the bucket) or flip (rappor designs) threshold, out of 2**64. */
  threshold: bigint;
  /** hashed: the number of hash buckets. */
  buckets?: number;
}

export function design(mechanism: string, k: number, epsilon: number): Design {
  if (!(MECHANISMS as readonly string[]).includes(mechanism)) {
    throw new VeilUsageError(`Unknown mechanism ${JSON.stringify(mechanism)}; choose one of ${MECHANISMS.join(", ")}.`);
  }
  if (!Number.isInteger(k) || k < 2) throw new VeilUsageError(`k must be a whole number of at least 2, not ${k}.`);
  if (mechanism === "warner" && k !== 2) throw new VeilUsageError(`Warner's design is for two categories, not ${k}.`);
  const gamma = epsilonToGamma(epsilon);
  const m = mechanism as Mechanism;
  if (m === "rappor" || m === "rappor-admissible") {
    // ceil(2**64 f) with f = 1 / (sqrt(gamma) + 1) bounded from above: r = isqrt(floor(gamma 2**128)).
    const [gn, gd] = ratio(gamma);
    const r = isqrt((gn * ONE64 * ONE64) / gd);
    return { mechanism: m, k, epsilon, gamma, q: 0, threshold: ceilDiv(ONE64 * ONE64, r + ONE64) };
  }
  const q = m === "subset" ? minimaxQ(k, gamma) : 1;
  return { mechanism: m, k, epsilon, gamma, q, threshold: keepThreshold(q, k, gamma) };
}

/** The keep threshold of a q-subset design over k categories: floor(2**64 p), p = q gamma /
 * (q gamma + k - q), exactly. */
export function keepThreshold(q: number, k: number, gamma: number): bigint {
  const [gn, gd] = ratio(gamma);
  const Q = BigInt(q);
  return (ONE64 * Q * gn) / (Q * gn + BigInt(k - q) * gd);
}

function ceilDiv(a: bigint, b: bigint): bigint {
  return (a + b - 1n) / b;
}

/** One randomized report of the true category value: its categories, increasing. */
export function randomize(d: Design, value: number, source: WordSource): number[] {
  if (d.mechanism === "hashed") throw new VeilUsageError("A hashed report randomizes a prefix: randomizeHashed.");
  if (!Number.isInteger(value) || value < 0 || value >= d.k) {
    throw new VeilUsageError(`A true value must be a category index from 0 to ${d.k - 1}.`);
  }
  if (d.q > 0) {
    const keep = bernoulli(source, d.threshold);
    const report = choose(source, d.k - 1, keep ? d.q - 1 : d.q).map((i) => i + (i >= value ? 1 : 0));
    if (keep) report.push(value);
    return report.sort((x, y) => x - y);
  }
  for (;;) {
    const report: number[] = [];
    for (let j = 0; j < d.k; j++) if ((j === value) !== bernoulli(source, d.threshold)) report.push(j);
    if (d.mechanism === "rappor" || (report.length > 0 && report.length < d.k)) return report;
  }
}
