// Memoized responses (docs/protocol.md, section 6): the randomized response to (metric,
// fingerprint, category) is drawn once and sent again whenever that category is reported again,
// so repeats tell an observer nothing new. Kept under HMAC-SHA256(device secret, metric,
// fingerprint, category), the Python SDK's key, so the stored memo names no value; whoever holds
// both the secret and the memo can still test which categories the device reported. The same
// secret gives a numeric mean part's rounding threshold (alpha), under a domain of its own.

import { hex, hmacSha256 } from "./sha256.js";

export const SECRET_BYTES = 32;
const DOMAIN = new TextEncoder().encode("veil.memo.v1\u0000");
const ALPHA_DOMAIN = new TextEncoder().encode("veil.alpha.v1\u0000");

function u32(n: number): Uint8Array {
  const out = new Uint8Array(4);
  new DataView(out.buffer).setUint32(0, n, true);
  return out;
}

export class Memo {
  private readonly responses: Map<string, number[]>;
  private readonly keys = new Map<string, string>();  // (metric, fingerprint, index) -> key, this process
  private readonly alphas = new Map<string, number>();  // (metric, fingerprint) -> alpha, this process

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
      key = hex(this.digest(DOMAIN, metric, fingerprint, u32(index)));
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
      const digest = this.digest(ALPHA_DOMAIN, metric, fingerprint, new Uint8Array(0));
      alpha = Number(new DataView(digest.buffer, digest.byteOffset, 8).getBigUint64(0, true) >> 11n) / 2 ** 53;
      this.alphas.set(id, alpha);
    }
    return alpha;
  }

  /** HMAC-SHA256(secret, domain | u32 len | metric | u32 len | fingerprint | tail), lengths in bytes
   * of UTF-8, little-endian. */
  private digest(domain: Uint8Array, metric: string, fingerprint: string, tail: Uint8Array): Uint8Array {
    const text = new TextEncoder();
    const name = text.encode(metric);
    const print = text.encode(fingerprint);
    return hmacSha256(this.secret, new Uint8Array([...domain, ...u32(name.length), ...name, ...u32(print.length),
      ...print, ...tail]));
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
