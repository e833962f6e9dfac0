// The device's state (secret, memo, ledger) kept in a directory in Node (the ledger's rules:
// ledger.test.ts).
import { strict as assert } from "node:assert";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { DeviceState } from "../src/device.js";
import type { Rule } from "../src/index.js";
import { nodeFileStore } from "../src/node.js";

const rule: Rule = { name: "os", periodSeconds: 86400, reportsPerPeriod: 2 };
const quiet = () => undefined;

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
  assert.equal(second.ledger.spent(rule, 5, 2, Infinity, 1).reports, 1);
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
  assert.ok(lines.some((m) => m.includes("cannot be used")) && await inMemory.ledgerStored());

  const directory = join(root, "device");
  const state = await DeviceState.open(nodeFileStore(directory), (_, m) => lines.push(m));
  rmSync(directory, { recursive: true });
  writeFileSync(directory, "");  // a file where the directory was
  assert.equal(state.ledger.admit(rule, 5, 1, null, Infinity), null);
  assert.equal(await state.ledgerStored(), false);
  assert.equal(await state.persisted(), false);
  assert.equal(state.ledger.spent(rule, 5, null, Infinity, 1).reports, 0);  // undone: not recorded
  assert.ok(lines.some((m) => m.includes("ledger cannot be written")));
});
