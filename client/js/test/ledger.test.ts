// The privacy ledger (docs/protocol.md, section 6): its rules, the shared budget vectors, and a
// Reporter against an HTTP aggregator on loopback (specs, uploads counted once per batch id, and
// the aggregator's clock in its specs answers) while its clock moves and its disk fills.
import { strict as assert } from "node:assert";
import { execFileSync } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync, unlinkSync, writeSync, closeSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";

import { ALLOWANCE_MS, boundedClock } from "../src/clock.js";
import { design, fingerprint, Ledger, Reporter, type Rule } from "../src/index.js";
import { nodeFileStore } from "../src/node.js";

const DAY = 86400;
const DAY_MS = DAY * 1000;
const YEAR_MS = 365 * DAY_MS;
const START = 1000 * DAY_MS + 3_600_000;  // Unix ms: an hour into a day
const LABELS = ["a", "b", "c", "d"];
const VECTORS = new URL("../../../../proto/veil/wire/v1/vectors/ledger_budgets.json", import.meta.url);
const rule = (reportsPerPeriod: number): Rule => ({ name: "m", periodSeconds: DAY, reportsPerPeriod });

// --- the rules --------------------------------------------------------------------------------

test("a period before the mark is refused: a clock set back never reopens one", () => {
  const ledger = new Ledger();
  assert.deepEqual([10, 10, 10].map((p) => ledger.admit(rule(2), p, 1, null, Infinity)), [null, null, "period"]);
  assert.equal(ledger.full(rule(2), 10), true);
  assert.equal(ledger.admit(rule(2), 11, 1, null, Infinity), null);  // a new period: the mark moves
  assert.equal(ledger.admit(rule(2), 10, 1, null, Infinity), "behind");
  assert.equal(ledger.admit(rule(2), 10, 0, null, Infinity), "behind");  // memoized too
  const restarted = new Ledger(ledger.toJson());
  assert.equal(restarted.admit(rule(2), 10, 1, null, Infinity), "behind");
  assert.equal(restarted.spent(rule(2), 10, null, Infinity, 1).periodStart, 11 * DAY);  // the mark's
  assert.equal(restarted.spent(rule(2), 10, null, Infinity, 1).lifetimeEpsilon, 3);
});

test("a report its budget cannot pay takes its place among the period's reports", () => {
  const ledger = new Ledger();
  assert.deepEqual([1, 1, 0].map((cost) => ledger.admit(rule(3), 0, cost, 1, Infinity)), [null, "budget", null]);
  assert.equal(ledger.admit(rule(3), 0, 0, 1, Infinity), "period");  // three taken: nothing more this period
  const lifetime = new Ledger();
  assert.deepEqual([0, 1, 2, 3].map((p) => lifetime.admit(rule(1), p, 0.1, null, 0.3)), [null, null, null, "budget"]);
  assert.equal(lifetime.spent(rule(1), 3, null, 0.3, 0.1).lifetimeEpsilon, 0.3);
});

test("budgets compare exactly by the shared rule: the budget vectors", () => {
  const file = JSON.parse(readFileSync(VECTORS, "utf8"));
  assert.equal(file.version, "v1");
  assert.ok(file.vectors.length > 100);
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  file.vectors.forEach((c: any, number: number) => {
    const ledger = new Ledger();
    const attempts = Math.min(c.reports_per_period, c.admitted + 2);
    const admitted = Array.from({ length: attempts },
      () => ledger.admit(rule(c.reports_per_period), 7, c.epsilon, c.period_budget, Infinity)).filter((r) => r === null);
    assert.equal(admitted.length, c.admitted, `vector ${number}: ${JSON.stringify(c)}`);
  });
});

test("the bounded clock", () => {
  let wall = 5_000_000;
  let server: number | null = null;
  const clock = boundedClock(() => wall, () => server);
  assert.equal(clock(), 5_000_000);  // the aggregator's time unknown: the device's clock
  server = 1_010_000;
  assert.equal(clock(), 1_010_000 + ALLOWANCE_MS);
  wall = 900_000;  // behind the aggregator: left as it is
  assert.equal(clock(), 900_000);
});

// --- a Reporter on loopback -------------------------------------------------------------------

interface Aggregator { url: string; reports: number; serverTime: number }

/** An HTTP aggregator on loopback serving one metric "m" (krr over LABELS), closed after the test;
 * serverTime (Unix seconds) is what its specs answers say (0: nothing, as revision 1). */
async function aggregator(t: TestContext, epsilon: number, reportsPerPeriod = 1, budgets: Record<string, number> = {}):
  Promise<Aggregator> {
  const spec = { name: "m", labels: LABELS, mechanism: "KRR", epsilon, q: design("krr", LABELS.length, epsilon).q,
    periodSeconds: DAY, reportsPerPeriod, ...budgets, fingerprint: fingerprint({ name: "m", labels: LABELS, mechanism: "krr", k: LABELS.length, epsilon, period: DAY,
      reportsPerPeriod }) };
  const seen = new Set<string>();
  const server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => { body += chunk; });
    request.on("end", () => {
      response.setHeader("content-type", "application/json");
      if (request.method === "GET" && request.url === "/v1/specs") {
        response.end(JSON.stringify({ specs: [spec], serverTimeUnix: String(state.serverTime) }));
      } else if (request.method === "POST" && request.url === "/v1/upload") {
        const upload = JSON.parse(body);
        if (!seen.has(upload.batchId)) state.reports += upload.count;
        seen.add(upload.batchId);
        response.end(JSON.stringify({ accepted: upload.count }));
      } else {
        response.statusCode = 404;
        response.end("{}");
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const state: Aggregator = { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, reports: 0,
    serverTime: 0 };
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return state;
}

class Clock {
  now = START;
  readonly read = () => this.now;
}

/** A Reporter of `agg` on `clock` with its specs, shut down after the test. */
async function reporter(t: TestContext, agg: Aggregator, clock: Clock, options: Record<string, unknown> = {}):
  Promise<Reporter> {
  const made = new Reporter({ endpoint: agg.url, clock: clock.read, scheduleDelayMs: 20, retryInitialBackoffMs: 5,
    retryMaxBackoffMs: 50, log: () => undefined, ...options });
  t.after(() => made.shutdown(100));
  assert.equal(await made.whenReady(), true);
  return made;
}

for (const memoize of [false, true]) {
  test(`a clock moved back and forth never reopens a period (memoize ${memoize})`, async (t) => {
    const agg = await aggregator(t, 1);
    const clock = new Clock();
    const r = await reporter(t, agg, clock, { memoize });
    for (let step = 0; step < 40; step++) {
      clock.now = START + (step % 2) * DAY_MS;
      r.report("m", "a");
      assert.ok(r.privacySpent("m")!.lifetimeEpsilon <= 2);
    }
    assert.equal(await r.flush(10_000), true);
    assert.equal(agg.reports, 2);
    assert.deepEqual([r.counters().accepted, r.counters().sent, r.counters().limited], [2, 2, 38]);
    assert.equal(await r.shutdown(1000), true);
  });

  test(`the mark holds across restarts and a clock years ahead (memoize ${memoize})`, async (t) => {
    const agg = await aggregator(t, 1);
    const directory = join(mkdtempSync(join(tmpdir(), "veil-")), "device");
    const clock = new Clock();
    // (days from the start, values, reports admitted) per Reporter, each a restart on one store; the
    // aggregator says no time, so nothing but the mark holds the clock.
    const runs: [number, string[], number][] = [
      [0, ["a"], 1], [1, ["a", "b"], 1], [0, ["a", "b"], 0], [3650, ["b"], 1], [0, ["a"], 0], [2, ["b", "a"], 0],
    ];
    for (const [days, values, admitted] of runs) {
      clock.now = START + days * DAY_MS;
      const r = await reporter(t, agg, clock, { memoize, store: nodeFileStore(directory) });
      for (const value of values) r.report("m", value);
      assert.equal(await r.flush(10_000), true);
      const spent = r.privacySpent("m")!;
      assert.equal(r.counters().accepted, admitted, `${days} days`);
      assert.ok(spent.reports <= 1 && spent.periodEpsilon <= spent.periodBudget && spent.lifetimeEpsilon <= 3);
      await r.shutdown(1000);
    }
    assert.equal(agg.reports, 3);
  });
}

test("a clock ahead is bounded by the aggregator's, across a restart too", async (t) => {
  const agg = await aggregator(t, 1);
  const directory = join(mkdtempSync(join(tmpdir(), "veil-")), "device");
  const clock = new Clock();
  agg.serverTime = START / 1000;  // the aggregator's clock: the device's before it jumps
  const first = await reporter(t, agg, clock, { store: nodeFileStore(directory) });
  first.report("m", "a");
  clock.now = START + 10 * YEAR_MS;
  first.report("m", "b");  // the same period still
  assert.equal(first.privacySpent("m")!.periodStart, Math.floor(START / DAY_MS) * DAY);
  assert.equal(await first.flush(10_000), true);
  assert.deepEqual([first.counters().sent, first.counters().limited], [1, 1]);
  await first.shutdown(1000);
  // A restart ten years ahead whose specs come from the network (their copy is gone): bounded once
  // they arrive; then the clock set back finds its period reported.
  unlinkSync(join(directory, "specs"));
  const second = await reporter(t, agg, clock, { store: nodeFileStore(directory) });
  second.report("m", "b");
  clock.now = START;
  second.report("m", "b");
  assert.equal(await second.flush(10_000), true);
  assert.deepEqual([second.counters().accepted, second.counters().limited], [0, 2]);
  assert.equal(agg.reports, 1);
  await second.shutdown(1000);
});

test("six reports of epsilon 0.15 fit the default budget", async (t) => {
  const agg = await aggregator(t, 0.15, 6);
  const r = await reporter(t, agg, new Clock(), { memoize: false });
  for (let i = 0; i < 7; i++) r.report("m", "a");
  assert.equal(await r.flush(10_000), true);
  assert.deepEqual([agg.reports, r.counters().limited, r.counters().overBudget], [6, 1, 0]);
  const spent = r.privacySpent("m")!;
  assert.deepEqual([spent.periodEpsilon, spent.periodBudget], [0.9, 0.9]);
  await r.shutdown(1000);
});

test("a value the budget cannot pay for takes the period's slot", async (t) => {
  const agg = await aggregator(t, 1, 1, { lifetimeBudget: 1 });
  const clock = new Clock();
  const r = await reporter(t, agg, clock);
  r.report("m", "a");
  clock.now += DAY_MS;
  r.report("m", "b");  // a new response the budget cannot pay: the period sends nothing,
  r.report("m", "a");  // not a's memoized response in its stead
  assert.equal(await r.flush(10_000), true);
  assert.deepEqual([agg.reports, r.counters().overBudget, r.counters().limited], [1, 1, 1]);
  clock.now += DAY_MS;
  r.report("m", "a");  // a new period whose first value is memoized: sent
  assert.equal(await r.flush(10_000), true);
  assert.equal(agg.reports, 2);
  await r.shutdown(1000);
});

/** A 64 KiB tmpfs, so that the disk fills for real (needs root, as the test machines run). */
function smallDisk(): string | null {
  const disk = mkdtempSync(join(tmpdir(), "veil-disk-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", disk], { stdio: "ignore" });
    return disk;
  } catch {
    return null;
  }
}

function fill(disk: string): string {
  const filler = join(disk, "filler");
  const fd = openSync(filler, "w");
  try {
    for (;;) writeSync(fd, new Uint8Array(512));
  } catch (error) {
    assert.equal((error as NodeJS.ErrnoException).code, "ENOSPC");
  } finally {
    closeSync(fd);
  }
  return filler;
}

test("a full disk refuses reports as ledgerUnavailable, never as spent", async (t) => {
  const disk = smallDisk();
  if (disk === null) return t.skip("cannot mount a small tmpfs (not root)");
  try {
    const agg = await aggregator(t, 0.25, 10_000);
    const lines: string[] = [];
    const r = await reporter(t, agg, new Clock(), { memoize: false, store: nodeFileStore(join(disk, "device")),
      log: (m: string) => lines.push(m) });
    r.report("m", "a");
    assert.equal(await r.flush(10_000), true);
    const filler = fill(disk);
    for (let i = 0; i < 5; i++) r.report("m", "a");
    assert.equal(await r.flush(10_000), false);
    const counters = r.counters();
    assert.deepEqual([counters.ledgerUnavailable, counters.overBudget, counters.accepted], [5, 0, 1]);
    const spent = r.privacySpent("m")!;  // what was recorded, not the refused reports
    assert.deepEqual([spent.reports, spent.periodEpsilon, spent.lifetimeEpsilon], [1, 0.25, 0.25]);
    assert.ok(lines.some((m) => m.includes("ledger cannot be written")));
    assert.ok(!lines.some((m) => m.includes("budget")));
    unlinkSync(filler);  // room again: admitted again
    r.report("m", "a");
    assert.equal(await r.flush(10_000), true);
    assert.deepEqual([r.counters().accepted, agg.reports], [2, 2]);
    assert.equal(await r.shutdown(1000), true);
  } finally {
    execFileSync("umount", ["-l", disk]);
    rmSync(disk, { recursive: true });
  }
});
