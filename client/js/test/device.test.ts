// The ledger's rules, and the device's state (secret, memo, ledger) kept in a directory in Node.
import { strict as assert } from "node:assert";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { DeviceState } from "../src/device.js";
import { Ledger, type Rule } from "../src/index.js";
import { nodeFileStore } from "../src/node.js";

const rule: Rule = { name: "os", periodSeconds: 86400, reportsPerPeriod: 2 };
const quiet = () => undefined;

test("at most reportsPerPeriod reports per period; a clock set back counts against the later period", () => {
  const ledger = new Ledger();
  assert.deepEqual([10, 10, 10].map((p) => ledger.admit(rule, p, 1, 9, Infinity)), [null, null, "period"]);
  assert.equal(ledger.full(rule, 10), true);
  assert.equal(ledger.admit(rule, 11, 1, 9, Infinity), null);  // a new period
  assert.equal(ledger.admit(rule, 10, 1, 9, Infinity), null);  // set back: the later period's second
  assert.equal(ledger.admit(rule, 10, 1, 9, Infinity), "period");
  assert.equal(ledger.spent(rule, 11, 9, Infinity).lifetimeEpsilon, 4);
});

test("budgets: a fresh response spends epsilon, a memoized one nothing; ten of 0.1 fit 1.0", () => {
  const ledger = new Ledger();
  const many = { ...rule, reportsPerPeriod: 100 };
  assert.deepEqual([0, 1, 2].map(() => ledger.admit(many, 0, 1, 2, 3)), [null, null, "budget"]);
  assert.equal(ledger.admit(many, 0, 0, 2, 3), null);  // a memoized response
  assert.equal(ledger.admit(many, 1, 1, 2, 3), null);
  assert.equal(ledger.admit(many, 2, 1, 2, 3), "budget");  // lifetime 3 spent
  const tenths = new Ledger();
  assert.ok(Array.from({ length: 10 }, () => tenths.admit(many, 0, 0.1, 1, Infinity)).every((r) => r === null));
  assert.equal(new Ledger(ledger.toJson()).spent(many, 2, 2, 3).lifetimeEpsilon, 3);
});

test("a directory keeps the secret, the memo and the ledger across restarts, owner-only", async () => {
  const directory = join(mkdtempSync(join(tmpdir(), "veil-")), "device");
  const first = await DeviceState.open(nodeFileStore(directory), quiet);
  const key = first.memo.key("os", "f", 3);
  const response = first.memo.response(key, () => [1, 4]);
  first.changed("memo");
  assert.equal(first.ledger.admit(rule, 5, 1, 2, Infinity), null);
  first.changed("ledger");
  assert.equal(await first.persisted(), true);

  const second = await DeviceState.open(nodeFileStore(directory), quiet);
  assert.equal(second.memo.key("os", "f", 3), key);  // the same secret
  assert.deepEqual(second.memo.response(key, () => assert.fail("drawn again")), response);
  assert.equal(second.ledger.spent(rule, 5, 2, Infinity).reports, 1);
  assert.equal(statSync(directory).mode & 0o777, 0o700);
  for (const name of ["device-key", "memo", "ledger"]) {
    assert.equal(statSync(join(directory, name)).mode & 0o777, 0o600, name);
    assert.ok(!readFileSync(join(directory, name), "utf8").includes("\"os\"") || name === "ledger");  // the memo names no metric
  }
});

test("a store that cannot be opened is replaced by memory; one that stops writing admits no more", async () => {
  const root = mkdtempSync(join(tmpdir(), "veil-"));
  writeFileSync(join(root, "file"), "");
  const lines: string[] = [];
  const inMemory = await DeviceState.open(nodeFileStore(join(root, "file", "device")), (_, m) => lines.push(m));
  assert.ok(lines.some((m) => m.includes("cannot be used")) && inMemory.writable);

  const directory = join(root, "device");
  const state = await DeviceState.open(nodeFileStore(directory), (_, m) => lines.push(m));
  rmSync(directory, { recursive: true });
  writeFileSync(directory, "");  // a file where the directory was
  state.changed("ledger");
  assert.equal(await state.persisted(), false);
  assert.equal(state.writable, false);
  assert.ok(lines.some((m) => m.includes("cannot be written")));
});
