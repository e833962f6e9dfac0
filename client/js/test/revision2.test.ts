// Wire revision 2 from the TypeScript SDK, over HTTP against a real loopback collector
// (collector.ts): made_unix per time slot, several batches per POST /v1/uploads with each result
// handled alone, the revision-1 fallback, too late, the conditional specs check and the version in
// upload answers, the aggregator's clock, calls made before the first specs, and a served spec the
// SDK does not reproduce.
import { strict as assert } from "node:assert";
import { test } from "node:test";

import { Reporter, type ReporterOptions } from "../src/index.js";
import { Collector, metric } from "./collector.js";

const T = 1_700_000_123_400;  // a device clock, Unix ms: 2023-11-14T22:15:23.4Z
const DAY = 86400;

async function withCollector(body: (c: Collector) => Promise<void>): Promise<void> {
  const collector = new Collector();
  await collector.start();
  try {
    await body(collector);
  } finally {
    await collector.stop();
  }
}

function reporter(collector: Collector, options: Partial<ReporterOptions> = {}): Reporter {
  return new Reporter({ endpoint: collector.url, scheduleDelayMs: 60_000, retryInitialBackoffMs: 5,
    retryMaxBackoffMs: 50, log: () => undefined, ...options });
}

const slot = (ms: number, seconds: number) => Math.floor(ms / 1000 / seconds) * seconds;

/** Wait until `condition` holds, checking every 5 ms; fails after 5 s. */
async function until(condition: () => boolean): Promise<void> {
  for (let waited = 0; !condition(); waited += 5) {
    assert.ok(waited < 5000, "waited 5 s in vain");
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

test("each batch says the start of the time slot its reports were made in", () => withCollector(async (c) => {
  c.metrics[0] = metric("browser", "subset", 4, 3600);  // a 1h window: finer than the day's period
  const start = 1_700_002_700_000;  // 100 s before an hour's end
  let now = start;
  c.clock = () => now / 1000;
  const r = reporter(c, { clock: () => now });
  assert.ok(await r.whenReady());
  r.report("browser", 1);
  r.report("country", 2);
  now += 200_000;  // the next hour (within the aggregator's time and its allowance)
  r.report("browser", 1);
  assert.ok(await r.flush(5000));
  const made = c.arrivals.map((a) => [a.metric, a.madeUnix]).sort();
  assert.deepEqual(made, [["browser", slot(start, 3600)], ["browser", slot(start, 3600) + 3600],
    ["country", slot(start, DAY)]]);
  await r.shutdown(1000);
}));

test("due batches of several metrics go in one POST /v1/uploads", () => withCollector(async (c) => {
  const r = reporter(c);
  assert.ok(await r.whenReady());
  for (const [m, v] of [["browser", 0], ["country", 1], ["theme", 2], ["opt_in", 1]] as const) r.report(m, v);
  assert.ok(await r.flush(5000));
  assert.deepEqual(c.batchCalls.map((ids) => ids.length), [4]);
  assert.equal(c.total(), 4);
  assert.deepEqual([r.counters().sent, r.counters().retried], [4, 0]);
  await r.shutdown(1000);
}));

test("each result is handled as its status alone: retried, final, too late", () => withCollector(async (c) => {
  const r = reporter(c);
  assert.ok(await r.whenReady());
  c.faults.push(14, 3, 11);  // UNAVAILABLE, INVALID_ARGUMENT, OUT_OF_RANGE for the first three batches
  for (const [m, v] of [["browser", 0], ["country", 1], ["theme", 2], ["opt_in", 1]] as const) r.report(m, v);
  assert.equal(await r.flush(5000), false, "reports were refused for good");
  assert.deepEqual(c.arrivals.map((a) => a.outcome), ["code 14", "code 3", "code 11", "counted", "counted"]);
  assert.equal(c.arrivals[4].batchId, c.arrivals[0].batchId, "the retry is the same batch id");
  const { sent, failed, tooLate, retried, queued } = r.counters();
  assert.deepEqual({ sent, failed, tooLate, retried, queued }, { sent: 2, failed: 1, tooLate: 1, retried: 1, queued: 0 });
  await r.shutdown(1000);
}));

test("reports made longer ago than the aggregator accepts: 410, counted as tooLate", () => withCollector(async (c) => {
  c.clock = () => T / 1000 + 3 * DAY;
  c.maxLateness = 25 * 3600;
  const r = reporter(c, { clock: () => T });
  assert.ok(await r.whenReady());
  r.report("browser", 3);
  assert.equal(await r.flush(5000), false);
  assert.deepEqual([r.counters().tooLate, r.counters().failed, r.counters().sent], [1, 0, 0]);
  assert.deepEqual(c.arrivals.map((a) => a.outcome), ["too late"]);
  await r.shutdown(1000);
}));

test("a revision-1 aggregator (its specs say no version): one POST /v1/upload per batch", () =>
  withCollector(async (c) => {
    c.revision = 1;
    const r = reporter(c);
    assert.ok(await r.whenReady());
    for (const [m, v] of [["browser", 0], ["country", 1], ["theme", 2]] as const) r.report(m, v);
    assert.ok(await r.flush(5000));
    assert.equal(c.batchCalls.length, 0);
    assert.deepEqual(c.arrivals.map((a) => a.outcome), Array(3).fill("counted"));
    assert.ok(c.arrivals.every((a) => a.madeUnix > 0), "made_unix is said all the same");
    await r.shutdown(1000);
  }));

test("POST /v1/uploads answered 404: asked once, then one POST /v1/upload per batch", () =>
  withCollector(async (c) => {
    c.uploadBatches = false;
    const r = reporter(c);
    assert.ok(await r.whenReady());
    for (let round = 0; round < 2; round++) {
      for (const [m, v] of [["browser", 0], ["country", 1], ["theme", 2]] as const) r.report(m, v);
      assert.ok(await r.flush(5000));
    }
    assert.equal(c.batchCalls.length, 1, "POST /v1/uploads is tried once, then never again");
    assert.deepEqual(c.arrivals.map((a) => a.outcome), Array(6).fill("counted"));
    assert.deepEqual([r.counters().sent, r.counters().retried], [6, 0]);
    await r.shutdown(1000);
  }));

test("specs: checked with If-None-Match at specTtlMs, fetched again when an upload names another version", () =>
  withCollector(async (c) => {
    const checking = reporter(c, { specTtlMs: 20 });
    assert.ok(await checking.whenReady());
    const version = c.version();
    await until(() => c.notModified >= 2);
    assert.ok(c.specRequests.slice(1).every((tag) => tag === `"${version}"`), "every check names the version held");
    assert.ok(checking.privacySpent("country"), "an unchanged answer keeps the specs");
    await checking.shutdown(1000);

    const r = reporter(c, { specTtlMs: 3_600_000 });
    assert.ok(await r.whenReady());
    c.metrics = c.metrics.filter((m) => m.name !== "country");  // the version changes
    const asked = c.specRequests.length;
    r.report("browser", 1);
    assert.ok(await r.flush(5000));
    await until(() => r.privacySpent("country") === undefined);  // the upload answer made it fetch
    assert.equal(c.specRequests.length, asked + 1);
    await r.shutdown(1000);
  }));

test("the aggregator's clock is held for the ledger", () => withCollector(async (c) => {
  c.clock = () => 2_000_000_000;
  const r = reporter(c);
  assert.ok(await r.whenReady());
  const said = r.serverClock.nowMs()!;
  assert.ok(said >= 2_000_000_000_000, String(said));  // the aggregator's (2033), not this machine's clock
  await r.shutdown(1000);
}));

test("calls before the first specs wait, bounded, and are randomized in the slot they were made in", () =>
  withCollector(async (c) => {
    c.serving = false;  // a first start with no specs yet
    c.metrics[0] = metric("browser", "subset", 4, 3600);
    let now = T;
    c.clock = () => now / 1000;
    const r = reporter(c, { clock: () => now, maxQueueSize: 3 });
    for (const v of [0, 1, 2, 3]) r.report("browser", v);
    assert.deepEqual([r.counters().queued, r.counters().dropped, r.counters().accepted], [3, 1, 0]);
    now += 3600 * 1000;  // the specs arrive an hour later, in the next slot
    c.serving = true;
    assert.ok(await r.whenReady(5000));
    assert.equal(await r.flush(5000), false, "a call was dropped since the start");
    assert.deepEqual([r.counters().sent, r.counters().queued], [3, 0]);
    assert.deepEqual(c.arrivals.map((a) => a.madeUnix), [slot(T, 3600)]);
    await r.shutdown(1000);
  }));

test("a served spec whose q this SDK does not compute is refused: its reports are dropped", () =>
  withCollector(async (c) => {
    c.wrongQ.set("browser", 3);  // subset k = 4 at epsilon 1 has q = 1
    const lines: string[] = [];
    const r = reporter(c, { log: (m) => lines.push(m) });
    assert.ok(await r.whenReady());
    r.report("browser", 1);
    r.report("country", 1);
    assert.equal(await r.flush(5000), false, "a report was dropped");
    assert.deepEqual([r.counters().dropped, r.counters().sent], [1, 1]);
    assert.deepEqual(c.arrivals.map((a) => a.metric), ["country"]);
    assert.equal(lines.filter((l) => l.includes("\"browser\"")).length, 1);
    await r.shutdown(1000);
  }));
