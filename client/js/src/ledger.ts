// The device's privacy ledger (docs/protocol.md, section 6): per metric, the reports sent and the
// epsilon spent in the current period, and the epsilon spent over the device's lifetime,
// persisted in a key-value store (localStorage in browsers, a file in Node: nodeFileStore).

/** Where the ledger lives: localStorage satisfies it; nodeFileStore(path) for Node. */
export interface KeyValueStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

export interface Rule {
  name: string;
  fingerprint: string;
  epsilon: number;
  periodSeconds: number;
  reportsPerPeriod: number;
  /** epsilon per period (0: reportsPerPeriod * epsilon) and per lifetime (0: no cap) */
  periodBudget?: number;
  lifetimeBudget?: number;
}

interface Entry { period: number; sent: number; spent: number; lifetime: number }

const KEY = "veil.ledger.v1";

/** Memory only: a new process starts a new ledger (as the Python SDK without a queue directory). */
export class MemoryStore implements KeyValueStore {
  private readonly items = new Map<string, string>();
  getItem(key: string): string | null { return this.items.get(key) ?? null; }
  setItem(key: string, value: string): void { this.items.set(key, value); }
}

export class Ledger {
  private entries: Record<string, Entry>;

  constructor(private readonly store: KeyValueStore = new MemoryStore()) {
    let loaded: Record<string, Entry> = {};
    try {
      loaded = JSON.parse(store.getItem(KEY) ?? "{}") ?? {};
    } catch {
      loaded = {};  // unreadable: start again, as a new device would
    }
    this.entries = loaded;
  }

  /** True (and recorded, persisted before the report can leave) when one fresh report of the
   * metric at `nowSeconds` is within the period's reports and both budgets. */
  admit(rule: Rule, nowSeconds: number): boolean {
    const key = `${rule.name}\u0000${rule.fingerprint}`;
    const period = Math.floor(nowSeconds / rule.periodSeconds);
    const old = this.entries[key];
    const entry: Entry = old && old.period === period ? { ...old }
      : { period, sent: 0, spent: 0, lifetime: old?.lifetime ?? 0 };
    const periodBudget = rule.periodBudget || rule.reportsPerPeriod * rule.epsilon;
    const lifetimeBudget = rule.lifetimeBudget || Infinity;
    // A relative slack of 1e-12 so that n reports of epsilon fit a budget of n * epsilon.
    const fits = (spent: number, budget: number) => spent + rule.epsilon <= budget * (1 + 1e-12);
    if (entry.sent >= rule.reportsPerPeriod || !fits(entry.spent, periodBudget) || !fits(entry.lifetime, lifetimeBudget)) {
      return false;
    }
    entry.sent += 1;
    entry.spent += rule.epsilon;
    entry.lifetime += rule.epsilon;
    this.entries[key] = entry;
    this.store.setItem(KEY, JSON.stringify(this.entries));
    return true;
  }
}
