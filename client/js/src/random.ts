// Random decisions as integer operations on uint32 words (docs/protocol.md, "Randomness"): the
// same words give the same report in every implementation.

/** A source of uniform uint32 words. */
export interface WordSource {
  next(): number;
}

const WORD = 1n << 32n;
const LOW = WORD - 1n;
const BLOCK = 1024;

/** The platform CSPRNG (Web Crypto's getRandomValues, in Node and browsers), read a block at a time. */
export class SystemWords implements WordSource {
  private block = new Uint32Array(BLOCK);
  private position = BLOCK;

  next(): number {
    if (this.position >= BLOCK) {
      globalThis.crypto.getRandomValues(this.block);
      this.position = 0;
    }
    return this.block[this.position++];
  }
}

/** Given words, for tests: throws when they run out. */
export class GivenWords implements WordSource {
  position = 0;
  constructor(private readonly words: readonly number[]) {}

  next(): number {
    if (this.position >= this.words.length) throw new RangeError("The given words ran out.");
    return this.words[this.position++];
  }
}

/** A uniform integer in [0, n), 1 <= n <= 2**32: Lemire's multiply-shift with rejection. */
export function below(source: WordSource, n: number): number {
  const bn = BigInt(n);
  let product = BigInt(source.next()) * bn;
  let low = product & LOW;
  if (low < bn) {
    const floor = (WORD - bn) % bn;
    while (low < floor) {
      product = BigInt(source.next()) * bn;
      low = product & LOW;
    }
  }
  return Number(product >> 32n);
}

/** A uniform integer in [0, 2**64): the first word is the high half. */
export function bits64(source: WordSource): bigint {
  const high = BigInt(source.next());
  return (high << 32n) | BigInt(source.next());
}

/** True with probability exactly threshold / 2**64. */
export function bernoulli(source: WordSource, threshold: bigint): boolean {
  return bits64(source) < threshold;
}

/** m distinct integers from [0, n) by Floyd's algorithm, in the order chosen. */
export function choose(source: WordSource, n: number, m: number): number[] {
  const chosen: number[] = [];
  const seen = new Set<number>();
  for (let j = n - m; j < n; j++) {
    const t = below(source, j + 1);
    const pick = seen.has(t) ? j : t;
    seen.add(pick);
    chosen.push(pick);
  }
  return chosen;
}
