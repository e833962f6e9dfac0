// Strings metrics (docs/protocol.md section 10), as the Python SDK's veil.mechanism _strings.py: a
// string becomes a 6-byte code; a metric has seven rounds, each served as a spec of its own
// (`<metric>.r<round>`, mechanism HASHED) that estimates prefixes of the codes; a device answers
// the one round its secret picks (memo.ts: Memo.round) by hashing its code's prefix with a hash
// drawn at random and sending the hash and the bucket, the bucket through k-ary randomized
// response over the buckets.

import { epsilonToGamma, keepThreshold, VeilUsageError, type Design } from "./mechanism.js";
import { below, bernoulli, type WordSource } from "./random.js";
import { hex, sha256 } from "./sha256.js";

export const HASHED = "hashed";
export const CODE_BYTES = 6;
/** A byte per round, then the round that verifies the full codes. */
export const ROUNDS = CODE_BYTES + 1;
/** P = 2^31 - 1, the hash's prime modulus. */
export const MODULUS = 2 ** 31 - 1;
/** a_0 .. a_5, c, the bucket sent: 8 words, 32 bytes. */
export const REPORT_WORDS = CODE_BYTES + 2;
const MAX_BUCKETS = 1 << 16;
const HASH_DOMAIN = new TextEncoder().encode("veil.strings.v1\u0000");

/** A round of a strings metric (MetricSpec.strings), parents in increasing order. */
export interface Strings {
  /** The name apps report strings under. */
  metric: string;
  round: number;
  rounds: number;
  /** g, a power of two from 2 to 2^16. */
  buckets: number;
  /** The prefixes (round bytes each; CODE_BYTES in the last round) the round's candidates extend. */
  parents: readonly Uint8Array[];
}

/** The CODE_BYTES-byte code of a string (its UTF-8 bytes) or of raw bytes: the bytes zero-padded when
 * there are at most CODE_BYTES, else 0xff and the first CODE_BYTES - 1 bytes of
 * SHA-256("veil.strings.v1" 0x00 | bytes). */
export function stringCode(value: string | Uint8Array): Uint8Array {
  const data = typeof value === "string" ? new TextEncoder().encode(value) : value;
  if (!(data instanceof Uint8Array)) throw new VeilUsageError("A strings metric takes a string or bytes.");
  const code = new Uint8Array(CODE_BYTES);
  if (data.length <= CODE_BYTES) {
    code.set(data);
    return code;
  }
  code[0] = 0xff;
  const withDomain = new Uint8Array(HASH_DOMAIN.length + data.length);
  withDomain.set(HASH_DOMAIN);
  withDomain.set(data, HASH_DOMAIN.length);
  code.set(sha256(withDomain).subarray(0, CODE_BYTES - 1), 1);
  return code;
}

/** How a code (or a prefix of one) is shown: a short value as its text up to the zero padding
 * (undecodable bytes as \xNN, as Python's backslashreplace), a hashed one as "#" and hex. */
export function codeText(code: Uint8Array): string {
  if (code[0] === 0xff) return `#${hex(code.subarray(1))}`;
  let end = code.length;
  while (end > 0 && code[end - 1] === 0) end--;
  const bytes = code.subarray(0, end);
  let text = "";
  for (let i = 0; i < bytes.length;) {
    const length = utf8Length(bytes, i);
    if (length === 0) {
      text += `\\x${bytes[i].toString(16).padStart(2, "0")}`;
      i += 1;
    } else {
      text += new TextDecoder().decode(bytes.subarray(i, i + length));
      i += length;
    }
  }
  return text;
}

/** The length of the well-formed UTF-8 sequence starting at bytes[i] (RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), or 0 when there is none: Python's decoder's rule. */
function utf8Length(bytes: Uint8Array, i: number): number {
  const b = bytes[i];
  if (b < 0x80) return 1;
  const cont = (j: number, low = 0x80, high = 0xbf) => i + j < bytes.length && bytes[i + j] >= low
    && bytes[i + j] <= high;
  if (b >= 0xc2 && b <= 0xdf) return cont(1) ? 2 : 0;
  if (b >= 0xe0 && b <= 0xef) {
    const low = b === 0xe0 ? 0xa0 : 0x80;
    const high = b === 0xed ? 0x9f : 0xbf;
    return cont(1, low, high) && cont(2) ? 3 : 0;
  }
  if (b >= 0xf0 && b <= 0xf4) {
    const low = b === 0xf0 ? 0x90 : 0x80;
    const high = b === 0xf4 ? 0x8f : 0xbf;
    return cont(1, low, high) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

/** The wire name of a strings metric's round: `<metric>.r<round>`. */
export function roundName(metric: string, round: number): string {
  return `${metric}.r${round}`;
}

/** The length of the prefixes a round estimates (and a device hashes): round + 1, CODE_BYTES in the
 * last. */
export function prefixBytes(strings: Strings): number {
  return strings.round === ROUNDS - 1 ? CODE_BYTES : strings.round + 1;
}

function parentBytes(strings: Strings): number {
  return strings.round === ROUNDS - 1 ? CODE_BYTES : strings.round;
}

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

/** A round as served, checked as the Python SDK's StringsRound checks it, its parents sorted;
 * VeilUsageError when it is not one. */
export function checkStrings(strings: Strings): Strings {
  const { metric, round, rounds, buckets: g } = strings;
  if (typeof metric !== "string" || !metric) throw new VeilUsageError("A strings round needs its metric's name.");
  if (rounds !== ROUNDS || !Number.isInteger(round) || round < 0 || round >= ROUNDS) {
    throw new VeilUsageError(`A strings metric has rounds 0 to ${ROUNDS - 1} of ${ROUNDS}, not ${round} of ${rounds}.`);
  }
  if (!Number.isInteger(g) || g < 2 || g > MAX_BUCKETS || (g & (g - 1)) !== 0) {
    throw new VeilUsageError(`A strings round hashes into a power of two from 2 to 2^16 buckets, not ${g}.`);
  }
  const parents = [...strings.parents].sort(compareBytes);
  const length = parentBytes(strings);
  if (parents.length === 0 || parents.some((p, i) => p.length !== length || (i > 0 && compareBytes(parents[i - 1], p) === 0))) {
    throw new VeilUsageError(`Round ${round} needs distinct parent prefixes of ${length} bytes.`);
  }
  if (round === 0 && parents.length !== 1) throw new VeilUsageError("Round 0 extends the empty prefix alone.");
  return { metric, round, rounds, buckets: g, parents };
}

/** The number of candidates a round estimates (its k): 256 per parent, the parents themselves in
 * the last round. */
export function candidateCount(strings: Strings): number {
  return strings.round === ROUNDS - 1 ? strings.parents.length : 256 * strings.parents.length;
}

/** The prefixes a round estimates, in order: candidate i * 256 + b is parent i and the byte b (the
 * last round: the parents themselves). */
export function candidates(strings: Strings): Uint8Array[] {
  if (strings.round === ROUNDS - 1) return [...strings.parents];
  return strings.parents.flatMap((parent) => Array.from({ length: 256 }, (_, b) => Uint8Array.of(...parent, b)));
}

/** The canonical form's "strings" object (docs/protocol.md section 1), parents as lowercase hex. */
export function stringsJson(strings: Strings): string {
  return `{"buckets":${strings.buckets},"metric":${JSON.stringify(strings.metric)},` +
    `"parents":[${strings.parents.map((p) => `"${hex(p)}"`).join(",")}],"round":${strings.round},` +
    `"rounds":${strings.rounds}}`;
}

/** The design of a round: k candidates, `buckets` buckets, and k-RR's keep threshold over them,
 * floor(2^64 gamma / (gamma + g - 1)) (as design("krr", buckets, epsilon) computes it). */
export function hashedDesign(k: number, epsilon: number, buckets: number): Design {
  if (!Number.isInteger(k) || k < 1) throw new VeilUsageError(`A hashed round estimates at least one candidate, not ${k}.`);
  if (!Number.isInteger(buckets) || buckets < 2 || buckets > MAX_BUCKETS || (buckets & (buckets - 1)) !== 0) {
    throw new VeilUsageError(`A hashed round has a power of two from 2 to 2^16 buckets, not ${buckets}.`);
  }
  const gamma = epsilonToGamma(epsilon);
  return { mechanism: HASHED, k, epsilon, gamma, q: 0, threshold: keepThreshold(1, buckets, gamma), buckets };
}

/** h(u) = (c + sum_i a_i u_i) mod P over a prefix's bytes u_i (coefficients a_0..a_5 then c). Each
 * a_i u_i is below 2^39 and the sum below 2^42: exact in doubles. */
export function prefixHash(coefficients: readonly number[], prefix: Uint8Array): number {
  let total = coefficients[CODE_BYTES];
  prefix.forEach((byte, i) => { total += coefficients[i] * byte; });
  return total % MODULUS;
}

/** The report of a device whose prefix is `prefix`: a_0..a_5 and c, each below(P) in that order,
 * then the bucket h(prefix) mod g through k-RR over g (keep = bernoulli(T); when not kept, o =
 * below(g - 1), sent as o, or o + 1 from the true bucket up). REPORT_WORDS (8) words. */
export function randomizeHashed(d: Design, prefix: Uint8Array, source: WordSource): number[] {
  if (d.mechanism !== HASHED || d.buckets === undefined) throw new VeilUsageError("A prefix is randomized by a hashed design.");
  if (!(prefix instanceof Uint8Array) || prefix.length > CODE_BYTES) {
    throw new VeilUsageError(`A prefix is at most ${CODE_BYTES} bytes.`);
  }
  const coefficients = Array.from({ length: CODE_BYTES + 1 }, () => below(source, MODULUS));
  let bucket = prefixHash(coefficients, prefix) & (d.buckets - 1);
  if (!bernoulli(source, d.threshold)) {
    const other = below(source, d.buckets - 1);
    bucket = other + (other >= bucket ? 1 : 0);
  }
  return [...coefficients, bucket];
}

/** The candidates (indices) a report holds: those hashing to its bucket under its hash (what the
 * aggregator counts). */
export function hashedSupport(report: readonly number[], candidateList: readonly Uint8Array[], buckets: number): number[] {
  const held: number[] = [];
  candidateList.forEach((c, i) => {
    if ((prefixHash(report, c) & (buckets - 1)) === report[CODE_BYTES + 1]) held.push(i);
  });
  return held;
}
