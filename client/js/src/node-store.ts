// The ledger's file in Node: owner-only (0600), replaced whole by rename so a crash leaves the
// old or the new state, never a torn one. Imported from "@veil/client/node" (browsers never load it).
import { readFileSync, renameSync, writeFileSync } from "node:fs";

import type { KeyValueStore } from "./ledger.js";

export function nodeFileStore(path: string): KeyValueStore {
  let items: Record<string, string> = {};
  try {
    items = JSON.parse(readFileSync(path, "utf8"));
  } catch {
    items = {};
  }
  return {
    getItem: (key) => items[key] ?? null,
    setItem: (key, value) => {
      items[key] = value;
      writeFileSync(`${path}.tmp`, JSON.stringify(items), { mode: 0o600 });
      renameSync(`${path}.tmp`, path);
    },
  };
}
