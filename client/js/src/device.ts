// One device's state in its DeviceStore: the secret (created once), the memo, the ledger and the
// last specs. Changes are made in memory at once (report() never waits) and written behind, in
// order. A report is queued only once the ledger that admitted it is stored (ledgerStored()); when
// that write fails the ledger goes back to what the store holds, so no spending it could not
// record stays. The uploader waits for persisted() before a batch leaves, so no report leaves the
// device before the response it used is stored either.

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
  /** What the last write of each failed (until one succeeds). */
  private readonly failing = new Set<Name>();
  /** Admissions waiting for the ledger to be stored: true once it is, false when it cannot be. */
  private ledgerWaiters: ((stored: boolean) => void)[] = [];

  private constructor(private readonly store: DeviceStore, readonly memo: Memo, readonly ledger: Ledger,
                      private storedLedger: string | null, public specs: string | null,
                      private readonly warn: (key: string, message: string) => void) {}

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
      const ledger = await store.read("ledger");
      return new DeviceState(store, memo, new Ledger(ledger), ledger, await store.read("specs"), warn);
    } catch {
      warn("store:open", `The Veil device store (${store.kind}) cannot be used; the memo and the ledger live in ` +
        "memory, and a restart starts new ones.");
      const secret = globalThis.crypto.getRandomValues(new Uint8Array(SECRET_BYTES));
      return new DeviceState(new MemoryStore(), new Memo(secret), new Ledger(), null, null, warn);
    }
  }

  /** Write `name` behind (after what is being written now). */
  changed(name: Name): void {
    this.dirty.add(name);
    if (this.scheduled) return;
    this.scheduled = true;
    this.writing = this.writing.then(() => this.writeDirty());
  }

  /** Write the ledger as it is now: true once it is stored, false when it cannot be (its changes
   * since the last write that succeeded are then undone). */
  ledgerStored(): Promise<boolean> {
    this.changed("ledger");
    return new Promise((resolve) => this.ledgerWaiters.push(resolve));
  }

  /** True once everything changed so far is stored; false while the last write of something failed. */
  async persisted(): Promise<boolean> {
    await this.writing;
    return this.failing.size === 0;
  }

  private async writeDirty(): Promise<void> {
    this.scheduled = false;
    const names = [...this.dirty];
    this.dirty.clear();
    for (const name of names) {
      const text = name === "memo" ? this.memo.toJson() : name === "ledger" ? this.ledger.toJson() : this.specs;
      const waiting = name === "ledger" ? this.ledgerWaiters.splice(0) : [];
      try {
        if (text !== null) await this.store.write(name, text);
        this.failing.delete(name);
        if (name === "ledger") this.storedLedger = text;
        for (const admitted of waiting) admitted(true);
      } catch {
        if (name === "specs") continue;  // only a copy for the next start
        this.failing.add(name);
        if (name === "ledger") {
          // Undo what the store does not hold, the admissions made during the write included.
          this.ledger.restore(this.storedLedger);
          for (const refused of [...waiting, ...this.ledgerWaiters.splice(0)]) refused(false);
          this.warn("store:ledger", `The Veil privacy ledger cannot be written to the device store (${this.store.kind}); ` +
            "reports are refused until it can record their spending.");
        } else {
          this.warn("store:write", `The Veil device store (${this.store.kind}) cannot be written; reports whose ` +
            "responses it cannot record are dropped.");
        }
      }
    }
  }
}
