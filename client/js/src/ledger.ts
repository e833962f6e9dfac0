// The device's privacy ledger (docs/protocol.md, section 6): per metric, the reports sent and the
// epsilon spent in the current period, and the epsilon spent over the device's lifetime. A new
// randomized response spends epsilon; a memoized one sent again spends nothing new but still
// takes one of the period's reports. Kept as JSON text (the "ledger" of a DeviceStore).

/** What this device has spent on one metric, and what it may spend. */
export interface PrivacySpent {
  metric: string;
  /** Unix seconds: the current period is [periodStart, periodEnd). */
  periodStart: number;
  periodEnd: number;
  reports: number;
  reportsPerPeriod: number;
  periodEpsilon: number;
  periodBudget: number;
  lifetimeEpsilon: number;
  /** Infinity: no lifetime cap. */
  lifetimeBudget: number;
}

/** What the ledger needs of a metric. */
export interface Rule {
  name: string;
  periodSeconds: number;
  reportsPerPeriod: number;
}

/** Why a report was refused: the period's reports were sent, or a budget would be exceeded. */
export type Refusal = "period" | "budget";

interface State { period: number; reports: number; periodEpsilon: number; lifetimeEpsilon: number }

// Ten reports of epsilon 0.1 must fit a budget of 1.0 although their float sum exceeds it.
const SLACK = 1e-9;

export class Ledger {
  private readonly states = new Map<string, State>();

  /** The ledger of a JSON text written by toJson(); an unreadable text starts an empty one. */
  constructor(json: string | null = null) {
    try {
      for (const [metric, s] of Object.entries(JSON.parse(json ?? "{}") as Record<string, State>)) {
        const values = [s.period, s.reports, s.periodEpsilon, s.lifetimeEpsilon];
        if (values.every((v) => typeof v === "number" && Number.isFinite(v))) this.states.set(metric, s);
      }
    } catch {
      // unreadable: what it held is lost, as with a cleared store
    }
  }

  toJson(): string {
    return JSON.stringify(Object.fromEntries(this.states));
  }

  /** The early answer for a repeat: true when this period's reports were all sent already. */
  full(rule: Rule, period: number): boolean {
    const state = this.states.get(rule.name);
    return state !== undefined && state.period >= period && state.reports >= rule.reportsPerPeriod;
  }

  /** Record one report of the metric in `period` spending `cost`, or say why not. */
  admit(rule: Rule, period: number, cost: number, periodBudget: number, lifetimeBudget: number): Refusal | null {
    const state = this.current(rule.name, period);
    if (state.reports >= rule.reportsPerPeriod) return "period";
    if (cost > 0 && (state.periodEpsilon + cost > periodBudget * (1 + SLACK)
      || state.lifetimeEpsilon + cost > lifetimeBudget * (1 + SLACK))) return "budget";
    this.states.set(rule.name, { period: state.period, reports: state.reports + 1,
      periodEpsilon: state.periodEpsilon + cost, lifetimeEpsilon: state.lifetimeEpsilon + cost });
    return null;
  }

  spent(rule: Rule, period: number, periodBudget: number, lifetimeBudget: number): PrivacySpent {
    const s = this.current(rule.name, period);
    return { metric: rule.name, periodStart: s.period * rule.periodSeconds, periodEnd: (s.period + 1) * rule.periodSeconds,
      reports: s.reports, reportsPerPeriod: rule.reportsPerPeriod, periodEpsilon: s.periodEpsilon, periodBudget,
      lifetimeEpsilon: s.lifetimeEpsilon, lifetimeBudget };
  }

  private current(metric: string, period: number): State {
    const state = this.states.get(metric);
    // A clock set back counts against the later period: a spending is never undone.
    if (state && state.period >= period) return state;
    return { period, reports: 0, periodEpsilon: 0, lifetimeEpsilon: state?.lifetimeEpsilon ?? 0 };
  }
}
