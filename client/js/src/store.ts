// Where a device keeps its state (secret, memo, ledger, last specs): a few named texts. A file per
// name in Node (nodeFileStore), IndexedDB or localStorage in browsers (browserStore), or memory.

/** A device's durable texts. write() resolves once the text is stored (synced to disk in Node). */
export interface DeviceStore {
  /** What the store is, for log lines ("IndexedDB", "memory", a directory). */
  readonly kind: string;
  read(name: string): Promise<string | null>;
  write(name: string, text: string): Promise<void>;
}

/** Memory only: a new process (or page) starts a new device, with new responses and a new ledger. */
export class MemoryStore implements DeviceStore {
  readonly kind = "memory";
  private readonly items = new Map<string, string>();

  async read(name: string): Promise<string | null> {
    return this.items.get(name) ?? null;
  }

  async write(name: string, text: string): Promise<void> {
    this.items.set(name, text);
  }
}
