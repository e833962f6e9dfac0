// One device's state in its DeviceStore: the secret (created once), the memo, the ledger and the
// last specs. Changes are made in memory at once (report() never waits) and written behind, in
// order; the uploader waits for persisted() before a batch leaves, so no report leaves the device
// before the spending and the response it used are stored.

import { Ledger } from "./ledger.js";
import { Memo, SECRET_BYTES } from "./memo.js";
import { MemoryStore, type DeviceStore } from "./store.js";

type Name = "memo" | "ledger" | "specs";

function fromBase64(text: string | null): Uint8Array | null {
  if (text === null) return null;
  try {
    const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
    return bytes.length === SECRET_BYTES ? bytes : null;
  } catch {
    return null;
  }
}

const toBase64 = (bytes: Uint8Array) => btoa(String.fromCharCode(...bytes));

export class DeviceState {
  private readonly dirty = new Set<Name>();
  private writing: Promise<void> = Promise.resolve();
  private scheduled = false;
  private failed = false;

  private constructor(private readonly store: DeviceStore, readonly memo: Memo, readonly ledger: Ledger,
                      public specs: string | null, private readonly warn: (key: string, message: string) => void) {}

  /** The state kept in `store`; a store that cannot be read or written is replaced by memory. */
  static async open(store: DeviceStore, warn: (key: string, message: string) => void): Promise<DeviceState> {
    try {
      let secret = fromBase64(await store.read("device-key"));
      const fresh = secret === null;
      if (secret === null) {
        secret = globalThis.crypto.getRandomValues(new Uint8Array(SECRET_BYTES));
        await store.write("device-key", toBase64(secret));
      }
      // A new secret makes the old memo's keys meaningless: start it (not the ledger) afresh.
      const memo = new Memo(secret, fresh ? null : await store.read("memo"));
      return new DeviceState(store, memo, new Ledger(await store.read("ledger")), await store.read("specs"), warn);
    } catch {
      warn("store:open", `The Veil device store (${store.kind}) cannot be used; the memo and the ledger live in ` +
        "memory, and a restart starts new ones.");
      const secret = globalThis.crypto.getRandomValues(new Uint8Array(SECRET_BYTES));
      return new DeviceState(new MemoryStore(), new Memo(secret), new Ledger(), null, warn);
    }
  }

  /** Write `name` behind (after what is being written now). */
  changed(name: Name): void {
    this.dirty.add(name);
    if (this.scheduled) return;
    this.scheduled = true;
    this.writing = this.writing.then(() => this.writeDirty());
  }

  /** True once everything changed so far is stored; false when a write failed (then and since). */
  async persisted(): Promise<boolean> {
    await this.writing;
    return !this.failed;
  }

  /** Whether the state can still be written: a ledger that cannot record a spending admits nothing. */
  get writable(): boolean {
    return !this.failed;
  }

  private async writeDirty(): Promise<void> {
    this.scheduled = false;
    const names = [...this.dirty];
    this.dirty.clear();
    for (const name of names) {
      const text = name === "memo" ? this.memo.toJson() : name === "ledger" ? this.ledger.toJson() : this.specs;
      try {
        if (text !== null) await this.store.write(name, text);
      } catch {
        if (name === "specs") continue;  // only a copy for the next start
        this.failed = true;
        this.warn("store:write", `The Veil device store (${this.store.kind}) cannot be written; reports whose ` +
          "spending it cannot record are dropped.");
      }
    }
  }
}
