// Strings metrics from the TypeScript SDK (docs/protocol.md section 10), over HTTP against a real
// loopback collector (collector.ts) serving a strings metric's rounds: a string is reported in the
// device's round as the prefix of its code, hashed; a steady string keeps its memoized report
// across rounds whose candidates change; a string waits while its round is not served, or until an
// answer of its period confirms the specs, and is dropped once its period is over; a stale round's
// batch is dropped, counted and the specs fetched again; the wrong kind is dropped; rounds of another
// wire revision are refused, the other metrics still reported.
import { strict as assert } from "node:assert";
import { test } from "node:test";

import {
  candidates, CODE_BYTES, encodeUpload, fingerprint, hashedDesign, hashedSupport, Memo, MemoryStore, parseSpecs,
  prefixHash, randomizeHashed, REPORT_WORDS, Reporter, roundName, ROUNDS, stringCode, uploadJson, type ReporterOptions,
  type WordSource,
} from "../src/index.js";
import { Collector, servedStrings, stringsRound, type Arrival } from "./collector.js";

const METRIC = "crash";
const VALUE = "SIGBUS";  // CODE_BYTES long: its own code
const BUCKETS = 64;
const EPSILON = 8;  // with BUCKETS, a report keeps the true bucket unless bits64 >= 0.979 * 2^64

/** The first of a few fixed secrets whose device answers a round other than round 0 (the round the
 * aggregator always serves), so a test can leave its round out. */
const SECRET = [7, 11, 13, 17].map((s) => Uint8Array.from({ length: 32 }, (_, i) => i + s))
  .find((secret) => new Memo(secret).round(METRIC) !== 0)!;
const ROUND = new Memo(SECRET).round(METRIC);

/** Round r's parents: the r-byte prefix of VALUE's code and one other (the last round: full codes). */
function parents(round: number, other = 0x7a): Uint8Array[] {
  const code = stringCode(VALUE);
  if (round === 0) return [new Uint8Array(0)];
  const length = round === ROUNDS - 1 ? CODE_BYTES : round;
  const another = Uint8Array.from(code.subarray(0, length));
  another[length - 1] ^= other;
  return [code.slice(0, length), another];
}

async function withCollector(rounds: number[], body: (c: Collector) => Promise<void>): Promise<void> {
  const collector = new Collector();
  collector.metrics.push(...rounds.map((r) => stringsRound(METRIC, r, BUCKETS, parents(r), EPSILON)));
  await collector.start();
  try {
    await body(collector);
  } finally {
    await collector.stop();
  }
}

async function reporter(collector: Collector, options: Partial<ReporterOptions> = {}, store = new MemoryStore()):
  Promise<Reporter> {
  await store.write("device-key", btoa(String.fromCharCode(...SECRET)));
  return new Reporter({ endpoint: collector.url, store, scheduleDelayMs: 60_000, log: () => undefined, ...options });
}

/** The reports (REPORT_WORDS words each) of a hashed batch. */
function reports(arrival: Arrival): number[][] {
  const view = new DataView(arrival.columns.buffer, arrival.columns.byteOffset, arrival.columns.byteLength);
  assert.equal(arrival.columns.byteLength, arrival.count * 4 * REPORT_WORDS);
  return Array.from({ length: arrival.count }, (_, r) =>
    Array.from({ length: REPORT_WORDS }, (_, i) => view.getUint32(4 * (r * REPORT_WORDS + i), true)));
}

/** Wait (at most 5 s) until `condition` holds. */
async function eventually(condition: () => boolean): Promise<boolean> {
  const deadline = Date.now() + 5000;
  while (!condition() && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10));
  return condition();
}

/** One word again and again: deterministic reports, each keeping the true bucket (for tests only). */
const steady = (): WordSource => ({ next: () => 0x9e3779b9 });

test("a string is reported in the device's round, as the hashed prefix of its code", () =>
  withCollector([...Array(ROUNDS).keys()], async (c) => {
    const r = await reporter(c, { words: steady(), clock: () => 1_700_000_123_000 });
    assert.ok(await r.whenReady());
    r.report(METRIC, VALUE);
    r.report(METRIC, "a value longer than six bytes");
    assert.ok(await r.flush(5000));
    const name = roundName(METRIC, ROUND);
    assert.deepEqual(c.arrivals.map((a) => [a.metric, a.count, a.madeUnix, a.outcome]),
      [[name, 2, 1_699_920_000, "counted"]]);
    const round = c.metrics.find((m) => m.name === name)!.strings!;
    const prefixLength = ROUND === ROUNDS - 1 ? CODE_BYTES : ROUND + 1;
    const d = hashedDesign(candidates(round).length, EPSILON, BUCKETS);
    const sent = reports(c.arrivals[0]);
    for (const [i, value] of [VALUE, "a value longer than six bytes"].entries()) {
      const prefix = stringCode(value).subarray(0, prefixLength);
      assert.deepEqual(sent[i], randomizeHashed(d, prefix, steady()), value);
      assert.equal(sent[i][CODE_BYTES + 1], prefixHash(sent[i], prefix) & (BUCKETS - 1), `${value}: kept`);
    }
    // What the aggregator counts: VALUE's report holds VALUE's prefix among the round's candidates.
    const all = candidates(round);
    const mine = all.findIndex((p) => Buffer.from(p).equals(stringCode(VALUE).subarray(0, prefixLength)));
    assert.ok(mine >= 0 && hashedSupport(sent[0], all, BUCKETS).includes(mine));
    assert.deepEqual(r.privacySpent(METRIC)?.metric, name);
    await r.shutdown(1000);
  }));

test("a steady string keeps its memoized report, across rounds whose candidates change: epsilon is spent once", () =>
  withCollector([0, ROUND], async (c) => {
    const r = await reporter(c, { specTtlMs: 50 });
    assert.ok(await r.whenReady());
    for (let i = 0; i < 20; i++) r.report(METRIC, VALUE);
    assert.ok(await r.flush(5000));
    const [first] = c.arrivals;
    assert.equal(first.count, 20);
    assert.equal(new Set(reports(first).map((x) => x.join())).size, 1, "one report, sent 20 times");
    // The next period's round: other parents (as many), so another fingerprint; the same memo key.
    const name = roundName(METRIC, ROUND);
    c.metrics = c.metrics.map((m) => (m.name === name ? stringsRound(METRIC, ROUND, BUCKETS, parents(ROUND, 0x33),
      EPSILON) : m));
    // Two checks later the first one's answer (the new round) is in use.
    const asked = c.specRequests.length;
    assert.ok(await eventually(() => c.specRequests.length >= asked + 2));
    r.report(METRIC, VALUE);
    assert.ok(await r.flush(5000));
    const second = c.arrivals.at(-1)!;
    assert.notEqual(second.fingerprint, first.fingerprint);
    assert.deepEqual(reports(second), [reports(first)[0]]);
    const spent = r.privacySpent(METRIC)!;
    assert.deepEqual([spent.reports, spent.lifetimeEpsilon], [21, EPSILON]);
    await r.shutdown(1000);
  }));

test("a string waits, as made, while its round is not served, and is reported when a specs answer brings it", () =>
  withCollector([0], async (c) => {
    const made = 1_700_000_123_000;
    const r = await reporter(c, { specTtlMs: 50, clock: () => made });
    assert.ok(await r.whenReady());
    r.report(METRIC, VALUE);
    // No report yet (as in the Python SDK): flush does not wait for it.
    assert.equal(await r.flush(5000), true);
    assert.deepEqual([r.counters().queued, r.counters().accepted, c.arrivals.length], [1, 0, 0]);
    c.metrics.push(stringsRound(METRIC, ROUND, BUCKETS, parents(ROUND), EPSILON));
    assert.ok(await eventually(() => r.counters().accepted === 1));
    assert.ok(await r.flush(5000));
    assert.deepEqual(c.arrivals.map((a) => [a.metric, a.count, a.madeUnix]), [[roundName(METRIC, ROUND), 1, 1_699_920_000]]);
    await r.shutdown(1000);
  }));

test("bytes are reported as a string's bytes: the same code, the same memoized report", () =>
  withCollector([0, ROUND], async (c) => {
    const r = await reporter(c);
    assert.ok(await r.whenReady());
    r.report(METRIC, VALUE);
    r.report(METRIC, new TextEncoder().encode(VALUE));
    assert.ok(await r.flush(5000));
    const [first, second] = reports(c.arrivals[0]);
    assert.deepEqual(first, second);
    assert.deepEqual([r.counters().sent, r.privacySpent(METRIC)?.lifetimeEpsilon], [2, EPSILON]);
    await r.shutdown(1000);
  }));

test("specs known only from the device's copy: a string waits for an answer of its period", () =>
  withCollector([0, ROUND], async (c) => {
    const store = new MemoryStore();
    await store.write("specs", await (await fetch(`${c.url}/v1/specs`)).text());
    c.serving = false;
    const r = await reporter(c, { retryInitialBackoffMs: 20, retryMaxBackoffMs: 40 }, store);
    assert.ok(await r.whenReady());  // from the copy
    r.report(METRIC, VALUE);
    assert.deepEqual([r.counters().queued, r.counters().accepted], [1, 0]);
    c.serving = true;
    assert.ok(await eventually(() => r.counters().accepted === 1));
    assert.ok(await r.flush(5000));
    assert.deepEqual(c.arrivals.map((a) => [a.metric, a.count]), [[roundName(METRIC, ROUND), 1]]);
    await r.shutdown(1000);
  }));

test("a string that waited past its period is dropped and counted; a refused round drops at once", () =>
  withCollector([0], async (c) => {
    let now = 1_700_000_123_000;
    const lines: string[] = [];
    const r = await reporter(c, { specTtlMs: 50, clock: () => now, log: (m) => lines.push(m) });
    assert.ok(await r.whenReady());
    r.report(METRIC, VALUE);
    now += 86_400_000;  // the next day: the round the string waited for counts only the next day's
    c.metrics.push(stringsRound(METRIC, ROUND, BUCKETS, parents(ROUND), EPSILON));
    assert.ok(await eventually(() => r.counters().dropped === 1));
    assert.deepEqual([r.counters().queued, r.counters().accepted], [0, 0]);
    assert.ok(lines.some((l) => l.includes("waited for its round until its period was over")), lines.join("\n"));
    // The device's round served with a q this SDK does not compute: refused, so its strings are dropped.
    c.wrongQ.set(roundName(METRIC, ROUND), 1);
    const asked = c.specRequests.length;
    assert.ok(await eventually(() => c.specRequests.length >= asked + 2));
    r.report(METRIC, VALUE);
    assert.deepEqual([r.counters().dropped, r.counters().queued], [2, 0]);
    await r.shutdown(1000);
  }));

test("a strings metric's budgets, by its name or its round's (the lower wins)", () =>
  withCollector([0, ROUND], async (c) => {
    const r = await reporter(c, { memoize: { [METRIC]: false },
      lifetimeBudget: { [METRIC]: 2 * EPSILON, [roundName(METRIC, ROUND)]: 100 } });
    assert.ok(await r.whenReady());
    for (let i = 0; i < 3; i++) r.report(METRIC, VALUE);
    assert.ok(await r.flush(5000));
    assert.deepEqual([r.counters().sent, r.counters().overBudget], [2, 1]);
    await r.shutdown(1000);
  }));

test("a stale round's batch is refused for good, counted as failed, and the specs fetched again", () =>
  withCollector([0, ROUND], async (c) => {
    const r = await reporter(c);
    assert.ok(await r.whenReady());
    const fetched = c.specRequests.length;
    c.faults.push(9);  // FAILED_PRECONDITION: the round is over
    r.report(METRIC, VALUE);
    assert.equal(await r.flush(5000), false);
    assert.deepEqual([r.counters().failed, r.counters().sent, r.counters().queued], [1, 0, 0]);
    assert.ok(await eventually(() => c.specRequests.length > fetched));
    await r.shutdown(1000);
  }));

test("the wrong kind of value is dropped and counted; a round is not reported by its own name", () =>
  withCollector([0, ROUND], async (c) => {
    const lines: string[] = [];
    const r = await reporter(c, { log: (m) => lines.push(m) });
    r.report(METRIC, 3);  // held before the specs: dropped once they say the metric takes strings
    assert.ok(await r.whenReady());
    r.report(METRIC, 1.5);
    r.report(roundName(METRIC, ROUND), VALUE);
    r.report("browser", new TextEncoder().encode("x"));  // bytes are a strings metric's
    r.report(METRIC, VALUE);
    assert.equal(await r.flush(5000), false);
    assert.deepEqual([r.counters().dropped, r.counters().sent], [4, 1]);
    assert.ok(lines.some((l) => l.includes("is a round of the strings metric")), lines.join("\n"));
    await r.shutdown(1000);
  }));

test("a round is used only as served: its name, no labels, the hashed design, its fingerprint and q", async () => {
  const round = stringsRound(METRIC, 2, BUCKETS, parents(2), EPSILON);
  const k = candidates(round.strings!).length;
  const fp = fingerprint({ name: round.name, labels: [], mechanism: "hashed", k, epsilon: EPSILON, period: 86400,
    reportsPerPeriod: 1, strings: round.strings });
  const served = { name: round.name, mechanism: "HASHED", epsilon: EPSILON, fingerprint: fp, periodSeconds: 86400,
    strings: servedStrings(round.strings!) };
  const [metric] = parseSpecs({ specs: [served] }).metrics;
  assert.deepEqual([metric.name, metric.design.k, metric.design.buckets, metric.strings?.round], [round.name, 512, 64, 2]);
  // Parents served in any order are the round's, sorted.
  const reversed = { ...served, strings: { ...served.strings, parents: [...served.strings.parents as string[]].reverse() } };
  assert.equal(parseSpecs({ specs: [reversed] }).metrics.length, 1);
  for (const wrong of [{ name: "crash.r3" }, { labels: ["a"] }, { mechanism: "KRR" }, { q: 1 }, { fingerprint: "0".repeat(32) },
    { strings: undefined }, { strings: { ...served.strings, rounds: 9 } }, { strings: { ...served.strings, rounds: ROUNDS + 1 } },
    { strings: { ...served.strings, buckets: 48 } },
    { strings: { ...served.strings, parents: ["AA=="] } }, { strings: { ...served.strings, parents: [] } }]) {
    assert.deepEqual(parseSpecs({ specs: [{ ...served, ...wrong }] }).metrics, [], JSON.stringify(wrong));
  }
  // Round 0 extends the empty prefix alone.
  const zero = stringsRound(METRIC, 0, BUCKETS, [new Uint8Array(0)], EPSILON);
  const zeroFp = fingerprint({ name: zero.name, labels: [], mechanism: "hashed", k: 256, epsilon: EPSILON, period: 86400,
    reportsPerPeriod: 1, strings: zero.strings });
  assert.equal(parseSpecs({ specs: [{ ...served, name: zero.name, fingerprint: zeroFp,
    strings: servedStrings(zero.strings!) }] }).metrics.length, 1);
});

test("hashed reports travel as little-endian words, in UploadRequest.hashed (field 8, after made_unix)", () => {
  const d = hashedDesign(256, 1, 4);
  // a_0 .. a_5, c, the bucket; then a report of zeros.
  const reports = [[...Array.from({ length: CODE_BYTES }, (_, i) => i + 1), 2 ** 31 - 2, 3], Array(REPORT_WORDS).fill(0)];
  assert.deepEqual(reports.map((r) => r.length), [REPORT_WORDS, REPORT_WORDS]);
  const id = new Uint8Array(16).fill(1);
  const json = uploadJson(d, "m.r0", "f", reports, id, 1700006400);
  const words = Buffer.from((json.hashed as { words: string }).words, "base64");
  assert.equal(words.length, 2 * 4 * REPORT_WORDS);
  assert.equal(words.length, 64);  // 32 bytes a report
  assert.deepEqual([words.readUInt32LE(0), words.readUInt32LE(4 * CODE_BYTES), words.readUInt32LE(4 * CODE_BYTES + 4)],
    [1, 2 ** 31 - 2, 3]);
  assert.equal(json.madeUnix, "1700006400");
  const bytes = Buffer.from(encodeUpload(d, "m.r0", "f", reports, id, 1700006400));
  // ... count (field 4) = 2, made_unix (7) as a varint, then field 8: 64 bytes of words in a HashedReports.
  const tail = Buffer.concat([Buffer.from([0x20, 2, 0x38]), Buffer.from([0x80, 0x94, 0xd0, 0xaa, 0x06]),
    Buffer.from([0x42, words.length + 2, 0x0a, words.length]), words]);
  assert.ok(bytes.subarray(bytes.length - tail.length).equals(tail), bytes.toString("hex"));
});

test("rounds of another wire revision are refused: their strings dropped and counted, the other metrics reported",
  async () => {
    // 9: a revision-4 aggregator's rounds (8-byte codes), each under the fingerprint of its own canonical form.
    for (const rounds of [9, ROUNDS - 1, ROUNDS + 1]) {
      const collector = new Collector();
      collector.metrics.push(...[0, ROUND].map((r) => {
        const served = stringsRound(METRIC, r, BUCKETS, parents(r), EPSILON);
        return { ...served, strings: { ...served.strings!, rounds } };
      }));
      await collector.start();
      try {
        const lines: string[] = [];
        const r = await reporter(collector, { log: (m) => lines.push(m) });
        assert.ok(await r.whenReady());
        r.report(METRIC, VALUE);
        r.report(METRIC, new TextEncoder().encode(VALUE));
        r.report("browser", "browser1");
        assert.equal(await r.flush(5000), false, `rounds ${rounds}`);  // the drops since the start
        assert.deepEqual([r.counters().dropped, r.counters().queued, r.counters().sent], [2, 0, 1], `rounds ${rounds}`);
        assert.deepEqual(collector.arrivals.map((a) => [a.metric, a.count, a.outcome]), [["browser", 1, "counted"]]);
        assert.equal(r.privacySpent(METRIC), undefined);
        assert.ok(lines.some((l) => l.includes("does not match")), lines.join("\n"));
        await r.shutdown(1000);
      } finally {
        await collector.stop();
      }
    }
  });
