// The Reporter's promises that need no aggregator: misuse throws at the call, and nothing else
// does; the queue is bounded, dropping and counting; shutdown drops (and counts) what is left.
import { strict as assert } from "node:assert";
import { test } from "node:test";

import { Reporter, UnknownCategoryError, UnknownMetricError, VeilUsageError } from "../src/index.js";

// Port 9 on loopback: nothing listens, so the specs never arrive.
const UNREACHABLE = "http://127.0.0.1:9";

test("misuse throws at the call; settings are checked when the Reporter is made", async () => {
  assert.throws(() => new Reporter({}), VeilUsageError);
  assert.throws(() => new Reporter({ endpoint: UNREACHABLE, maxQueueSize: 0 }), /maxQueueSize must be a positive/);
  const reporter = new Reporter({ endpoint: UNREACHABLE, log: () => undefined });
  assert.throws(() => reporter.report(7 as unknown as string, 1), UnknownMetricError);
  for (const value of [Number.NaN, Infinity, null, false]) {
    assert.throws(() => reporter.report("os", value as unknown as number), UnknownCategoryError);
  }
  assert.doesNotThrow(() => reporter.report("nosuch", "label"));
  // Before the specs, -1 or 1.5 may be a numeric metric's number: they wait (numeric.test.ts).
  assert.doesNotThrow(() => reporter.report("os", 1.5));
  assert.equal(await reporter.shutdown(100), false);
});

test("calls beyond maxQueueSize are dropped and counted; shutdown drops and counts the rest", async () => {
  const lines: string[] = [];
  const reporter = new Reporter({ endpoint: UNREACHABLE, maxQueueSize: 10, log: (m) => lines.push(m) });
  for (let i = 0; i < 15; i++) reporter.report("os", i % 3);
  assert.deepEqual([reporter.counters().queued, reporter.counters().dropped], [10, 5]);
  assert.equal(await reporter.flush(200), false);
  assert.equal(await reporter.shutdown(200), false);
  assert.deepEqual([reporter.counters().queued, reporter.counters().dropped, reporter.counters().accepted], [0, 15, 0]);
  reporter.report("os", 1);  // after shutdown: dropped, counted
  assert.equal(reporter.counters().dropped, 16);
  assert.equal(lines.filter((l) => l.includes("queue is full")).length, 1);  // logged once
  assert.ok(lines.every((l) => !l.includes("os\"")));
});
