// Memoized responses (docs/protocol.md, section 6): the randomized response to (metric,
// fingerprint, category) is drawn once and sent again whenever that category is reported again,
// so repeats tell an observer nothing new. Kept under HMAC-SHA256(device secret, metric,
// fingerprint, category), the Python SDK's key, so the stored memo names no value; whoever holds
// both the secret and the memo can still test which categories the device reported. The same
// secret gives a numeric mean part's rounding threshold (alpha) and a strings metric's round,
// each under a domain of its own; a strings round's responses are keyed by its prefix (section 10).

import { hex, hmacSha256 } from "./sha256.js";
import { ROUNDS } from "./strings.js";

export const SECRET_BYTES = 32;
const DOMAIN = new TextEncoder().encode("veil.memo.v1\u0000");
const ALPHA_DOMAIN = new TextEncoder().encode("veil.alpha.v1\u0000");
const ROUND_DOMAIN = new TextEncoder().encode("veil.round.v1\u0000");
const STRINGS_DOMAIN = new TextEncoder().encode("veil.strings.memo.v1\u0000");

function u32(n: number): Uint8Array {
  const out = new Uint8Array(4);
  new DataView(out.buffer).setUint32(0, n, true);
  return out;
}

export class Memo {
  private readonly responses: Map<string, number[]>;
  private readonly keys = new Map<string, string>();  // (metric, fingerprint, index) -> key, this process
  private readonly alphas = new Map<string, number>();  // (metric, fingerprint) -> alpha, this process
  private readonly rounds = new Map<string, number>();  // strings metric -> its round, this process

  /** The memo of a JSON text written by toJson(); unreadable: empty (new responses are drawn). */
  constructor(readonly secret: Uint8Array, json: string | null = null) {
    let entries: [string, number[]][] = [];
    try {
      entries = Object.entries(JSON.parse(json ?? "{}") as Record<string, number[]>)
        .filter(([, r]) => Array.isArray(r) && r.every((j) => Number.isInteger(j) && j >= 0));
    } catch {
      entries = [];
    }
    this.responses = new Map(entries);
  }

  toJson(): string {
    return JSON.stringify(Object.fromEntries(this.responses));
  }

  get size(): number {
    return this.responses.size;
  }

  /** The memo key of a value: hex HMAC-SHA256(secret, domain | len | metric | len | fingerprint | index). */
  key(metric: string, fingerprint: string, index: number): string {
    const id = `${metric}\u0000${fingerprint}\u0000${index}`;
    let key = this.keys.get(id);
    if (key === undefined) {
      key = hex(this.digest(DOMAIN, [metric, fingerprint], u32(index)));
      this.keys.set(id, key);
    }
    return key;
  }

  /** The device's rounding threshold for a numeric mean part (docs/protocol.md section 9): the
   * first 8 bytes of HMAC-SHA256(secret, alpha domain | len | metric | len | fingerprint) as a
   * little-endian uint64, its top 53 bits over 2**53. Uniform over devices, fixed for this one: a
   * number that stays put keeps its point, and its memoized response. */
  alpha(metric: string, fingerprint: string): number {
    const id = `${metric}\u0000${fingerprint}`;
    let alpha = this.alphas.get(id);
    if (alpha === undefined) {
      const digest = this.digest(ALPHA_DOMAIN, [metric, fingerprint]);
      alpha = Number(new DataView(digest.buffer, digest.byteOffset, 8).getBigUint64(0, true) >> 11n) / 2 ** 53;
      this.alphas.set(id, alpha);
    }
    return alpha;
  }

  /** The round this device answers of a strings metric (docs/protocol.md section 10): the first 8
   * bytes of HMAC-SHA256(secret, round domain | len | metric) as a little-endian uint64 x, and
   * floor(x * ROUNDS / 2**64) (ROUNDS = 7). Fixed by the secret, whatever the device reports. */
  round(metric: string): number {
    let round = this.rounds.get(metric);
    if (round === undefined) {
      const digest = this.digest(ROUND_DOMAIN, [metric]);
      const x = new DataView(digest.buffer, digest.byteOffset, 8).getBigUint64(0, true);
      round = Number((x * BigInt(ROUNDS)) >> 64n);
      this.rounds.set(metric, round);
    }
    return round;
  }

  /** The memo key of a strings round's report: hex HMAC-SHA256(secret, strings domain | len | round
   * name | len | design | len | prefix), design the fingerprint of the round's designSpec (a report
   * depends on the prefix, the buckets and epsilon, not on the candidates). */
  stringsKey(round: string, design: string, prefix: Uint8Array): string {
    return hex(this.digest(STRINGS_DOMAIN, [round, design, prefix]));
  }

  /** HMAC-SHA256(secret, domain | u32 len | field | ... | tail): each field's length in bytes (of
   * UTF-8 for a string), little-endian, before it. */
  private digest(domain: Uint8Array, fields: (string | Uint8Array)[], tail: Uint8Array = new Uint8Array(0)): Uint8Array {
    const text = new TextEncoder();
    const parts: number[] = [...domain];
    for (const field of fields) {
      const bytes = typeof field === "string" ? text.encode(field) : field;
      parts.push(...u32(bytes.length), ...bytes);
    }
    return hmacSha256(this.secret, Uint8Array.from([...parts, ...tail]));
  }

  known(key: string): boolean {
    return this.responses.has(key);
  }

  /** The response memoized under `key`, drawn with `draw` (and remembered) the first time. */
  response(key: string, draw: () => number[]): number[] {
    let found = this.responses.get(key);
    if (found === undefined) {
      found = draw();
      this.responses.set(key, found);
    }
    return found;
  }
}
