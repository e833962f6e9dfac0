// Numeric metrics from the TypeScript SDK (docs/protocol.md section 9), over HTTP against a real
// loopback collector (collector.ts) serving a numeric metric's two parts: a number is reported as
// its category in each part, clipped and counted outside the range, with the device's alpha; a
// steady number keeps its memoized responses; misuse throws at the call.
import { strict as assert } from "node:assert";
import { test } from "node:test";

import { Memo, MemoryStore, Reporter, UnknownCategoryError, type Numeric, type ReporterOptions } from "../src/index.js";
import { Collector, numericPart } from "./collector.js";

const MEAN: Numeric = { metric: "load_ms", part: "mean", low: 0, high: 10000, boundaries: [], levels: 3 };
const DISTRIBUTION: Numeric = { metric: "load_ms", part: "distribution", low: 0, high: 10000,
  boundaries: [100, 250, 500, 1000, 2500], levels: 0 };
const SECRET = Uint8Array.from({ length: 32 }, (_, i) => i + 7);

async function withCollector(body: (c: Collector) => Promise<void>): Promise<void> {
  const collector = new Collector();
  // k-RR in both parts: a report kept is the category itself, one bit of a one-byte bitmap.
  collector.metrics.push(numericPart(MEAN, "krr"), numericPart(DISTRIBUTION, "krr"));
  await collector.start();
  try {
    await body(collector);
  } finally {
    await collector.stop();
  }
}

async function reporter(collector: Collector, options: Partial<ReporterOptions> = {}): Promise<Reporter> {
  const store = new MemoryStore();
  await store.write("device-key", btoa(String.fromCharCode(...SECRET)));
  return new Reporter({ endpoint: collector.url, store, scheduleDelayMs: 60_000, log: () => undefined, ...options });
}

/** The categories a part's counted batches carry, one per report (k-RR reports of one bit). */
function categories(c: Collector, metric: string): number[] {
  return c.arrivals.filter((a) => a.metric === metric && a.outcome === "counted")
    .flatMap((a) => [...a.columns].map((byte) => Math.log2(byte)));
}

/** The fingerprint the collector serves for the mean part (alpha depends on it). */
async function meanFingerprint(c: Collector): Promise<string> {
  const answer = await (await fetch(`${c.url}/v1/specs`)).json() as { specs: { name: string; fingerprint: string }[] };
  return answer.specs.find((s) => s.name === "load_ms.mean")!.fingerprint;
}

test("a number is its category in every part; outside the range it is clipped and counted", () =>
  withCollector(async (c) => {
    // Words of zeros: every k-RR report keeps the true category (for this test only).
    const r = await reporter(c, { words: { next: () => 0 } });
    assert.ok(await r.whenReady());
    const values = [412.7, 450, -5, 20001, 2500, 5000, -0];
    for (const x of values) r.report("load_ms", x);
    assert.ok(await r.flush(5000));
    assert.deepEqual(categories(c, "load_ms.distribution"), [2, 2, 0, 5, 5, 5, 0]);
    // The mean's points are 0, 5000 and 10000: a point is its own category whatever alpha is;
    // between two, the upper one when the fraction past the lower exceeds this device's alpha
    // (0.089 for this secret: 412.7 rounds down, 450 up).
    const alpha = new Memo(SECRET).alpha("load_ms.mean", await meanFingerprint(c));
    assert.ok(412.7 / 10000 * 2 < alpha && alpha < 450 / 10000 * 2, String(alpha));
    assert.deepEqual(categories(c, "load_ms.mean"), [0, 1, 0, 2, 1, 1, 0]);
    const { accepted, sent, clipped, dropped } = r.counters();
    assert.deepEqual({ accepted, sent, clipped, dropped }, { accepted: 14, sent: 14, clipped: 2, dropped: 0 });
    await r.shutdown(1000);
  }));

test("a steady number keeps each part's memoized response: epsilon is spent once per part", () =>
  withCollector(async (c) => {
    const r = await reporter(c);
    assert.ok(await r.whenReady());
    for (let i = 0; i < 20; i++) r.report("load_ms", 412.7);
    assert.ok(await r.flush(5000));
    for (const part of ["load_ms.mean", "load_ms.distribution"]) {
      const [batch] = c.arrivals.filter((a) => a.metric === part);
      assert.equal(batch.count, 20, part);
      assert.equal(new Set(batch.columns).size, 1, `${part}: one response, sent 20 times`);
      const spent = r.privacySpent(part)!;
      assert.deepEqual([spent.reports, spent.lifetimeEpsilon], [20, 1], part);
    }
    await r.shutdown(1000);

    // memoize: { load_ms: false } names both parts: each report a fresh response.
    const fresh = await reporter(c, { memoize: { load_ms: false } });
    assert.ok(await fresh.whenReady());
    for (let i = 0; i < 20; i++) fresh.report("load_ms", 412.7);
    assert.ok(await fresh.flush(5000));
    assert.deepEqual(["load_ms.mean", "load_ms.distribution"].map((m) => fresh.privacySpent(m)!.lifetimeEpsilon),
      [20, 20]);
    await fresh.shutdown(1000);
  }));

test("misuse throws at the call; what only the specs tell apart waits for them and is dropped", () =>
  withCollector(async (c) => {
    c.serving = false;  // no specs yet
    const lines: string[] = [];
    const r = await reporter(c, { log: (m) => lines.push(m) });
    for (const x of [Number.NaN, Infinity, -Infinity, true, null, undefined, {}]) {
      assert.throws(() => r.report("load_ms", x as unknown as number), UnknownCategoryError, String(x));
    }
    r.report("load_ms", 412.7);  // waits, as made
    r.report("load_ms", "fast");  // waits: a label, for a metric the specs will say is numeric
    r.report("browser", 1.5);  // waits: a number that is no category index
    assert.equal(r.counters().queued, 3);
    c.serving = true;
    assert.ok(await r.whenReady(5000));
    assert.equal(await r.flush(5000), false, "two calls were dropped");
    assert.deepEqual([r.counters().sent, r.counters().dropped], [2, 2]);
    // Once the specs are known, a value not of the metric's kind throws at the call.
    assert.throws(() => r.report("load_ms", "fast"), /load_ms" is numeric/);
    assert.throws(() => r.report("browser", 1.5), UnknownCategoryError);
    assert.throws(() => r.report("browser", -1), UnknownCategoryError);
    // A part by its own name, a metric the specs lack: dropped and counted, never thrown.
    r.report("load_ms.mean", 1);
    r.report("nosuch", 2.5);
    assert.equal(r.counters().dropped, 4);
    assert.ok(lines.some((l) => l.includes("is a part of the numeric metric \"load_ms\"")), lines.join("\n"));
    await r.shutdown(1000);
  }));

test("a part this SDK does not reproduce is left out: the number goes to the other part", () =>
  withCollector(async (c) => {
    const distribution = c.metrics.find((m) => m.name === "load_ms.distribution")!;
    distribution.labels = distribution.labels.map((l) => l.replace("[0, ", "[0.0, "));  // not Python's text
    const r = await reporter(c);
    assert.ok(await r.whenReady());
    r.report("load_ms", 412.7);
    assert.ok(await r.flush(5000));
    assert.deepEqual(c.arrivals.map((a) => a.metric), ["load_ms.mean"]);
    assert.equal(r.privacySpent("load_ms.distribution"), undefined);
    await r.shutdown(1000);
  }));
