// The ledger: the period bound, both budgets, periods aligned to the epoch, and persistence.
import { strict as assert } from "node:assert";
import { mkdtempSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Ledger, type Rule } from "../src/index.js";
import { nodeFileStore } from "../src/node-store.js";

const DAY = 86400;
const rule: Rule = { name: "os", fingerprint: "f", epsilon: 1, periodSeconds: DAY, reportsPerPeriod: 2 };

test("at most reportsPerPeriod reports per period, periods aligned to the Unix epoch", () => {
  const ledger = new Ledger();
  assert.deepEqual([0, 1, 2].map((s) => ledger.admit(rule, 10 * DAY + s)), [true, true, false]);
  assert.equal(ledger.admit(rule, 11 * DAY - 1), false);
  assert.equal(ledger.admit(rule, 11 * DAY), true);  // a new period
});

test("the period and lifetime budgets cap what is spent", () => {
  const ledger = new Ledger();
  const capped = { ...rule, reportsPerPeriod: 5, periodBudget: 2, lifetimeBudget: 3 };
  assert.deepEqual([0, 1, 2].map((s) => ledger.admit(capped, s)), [true, true, false]);
  assert.deepEqual([0, 1].map((s) => ledger.admit(capped, DAY + s)), [true, false]);  // lifetime 3 spent
  assert.equal(ledger.admit(capped, 9 * DAY), false);
});

test("a file in Node keeps the ledger across restarts, owner-only", () => {
  const path = join(mkdtempSync(join(tmpdir(), "veil-")), "ledger.json");
  assert.equal(new Ledger(nodeFileStore(path)).admit(rule, 5), true);
  assert.equal(new Ledger(nodeFileStore(path)).admit(rule, 6), true);
  assert.equal(new Ledger(nodeFileStore(path)).admit(rule, 7), false);  // a restart forgets nothing
  assert.equal(statSync(path).mode & 0o777, 0o600);
});
