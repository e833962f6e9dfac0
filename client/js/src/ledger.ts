// The device's privacy ledger (docs/protocol.md, section 6): per metric, the reports sent and the
// epsilon spent in the current period, and the epsilon spent over the device's lifetime. A new
// randomized response spends epsilon; a memoized one sent again spends nothing new but still
// takes one of the period's reports, and so does a report refused for its budget (a later value
// of the period is never sent in its stead). Epsilon is counted in whole nano-epsilon (units),
// compared as integers by the rule section 6 states (the Python SDK's too). The period a
// metric's state belongs to is the latest one admitted in (its mark): a report of an earlier
// period (a clock set back) is refused. Kept as JSON text (the "ledger" of a DeviceStore).

/** What this device has spent on one metric, and what it may spend. */
export interface PrivacySpent {
  metric: string;
  /** Unix seconds: the current period is [periodStart, periodEnd). */
  periodStart: number;
  periodEnd: number;
  /** Reports admitted in this period, and those refused for their budget. */
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

/** Why a report was refused: the period's reports were sent, its period is before the mark (the
 * clock went back), or a budget would be exceeded. */
export type Refusal = "period" | "behind" | "budget";

/** Units per epsilon. */
const UNIT = 1e9;
// Units are exact as doubles and survive the stored epsilon (n / UNIT, read back by units()) below
// 2^51; a budget of that many units or more is no cap.
const NO_CAP = 2 ** 51;

/** Epsilon in whole nano-epsilon, rounded half up: floor(epsilon * 1e9 + 0.5) in doubles (as the
 * Python SDK computes it). */
export function units(epsilon: number): number {
  return Math.floor(epsilon * UNIT + 0.5);
}

/** A budget in units; null: no cap. */
function cap(budget: number | null): number | null {
  return budget === null || !(budget * UNIT < NO_CAP) ? null : units(budget);
}

interface State { period: number; reports: number; periodUnits: number; lifetimeUnits: number }
/** The stored form: epsilon, as earlier versions stored it. */
interface Stored { period: number; reports: number; periodEpsilon: number; lifetimeEpsilon: number }

export class Ledger {
  private readonly states = new Map<string, State>();

  /** The ledger of a JSON text written by toJson(); an unreadable text starts an empty one. */
  constructor(json: string | null = null) {
    this.restore(json);
  }

  /** Make the ledger what a JSON text written by toJson() holds (what the store holds, when
   * writing what was admitted since failed). */
  restore(json: string | null): void {
    this.states.clear();
    try {
      for (const [metric, s] of Object.entries(JSON.parse(json ?? "{}") as Record<string, Stored>)) {
        const values = [s.period, s.reports, s.periodEpsilon, s.lifetimeEpsilon];
        if (values.every((v) => typeof v === "number" && Number.isFinite(v))) {
          this.states.set(metric, { period: s.period, reports: s.reports, periodUnits: units(s.periodEpsilon),
            lifetimeUnits: units(s.lifetimeEpsilon) });
        }
      }
    } catch {
      // unreadable: what it held is lost, as with a cleared store
    }
  }

  toJson(): string {
    const stored: Record<string, Stored> = {};
    for (const [metric, s] of this.states) {
      stored[metric] = { period: s.period, reports: s.reports, periodEpsilon: s.periodUnits / UNIT,
        lifetimeEpsilon: s.lifetimeUnits / UNIT };
    }
    return JSON.stringify(stored);
  }

  /** The early answer for a repeat: true when this period's reports were all sent already. */
  full(rule: Rule, period: number): boolean {
    const state = this.states.get(rule.name);
    return state !== undefined && state.period === period && state.reports >= rule.reportsPerPeriod;
  }

  /** Record one report of the metric in `period` spending `cost` epsilon, or say why not
   * (periodBudget null: the period's reports are its only bound). A refusal for the budget is
   * recorded too: it takes its place among the period's reports. */
  admit(rule: Rule, period: number, cost: number, periodBudget: number | null, lifetimeBudget: number):
    Refusal | null {
    const known = this.states.get(rule.name);
    if (known !== undefined && period < known.period) return "behind";
    const state = this.at(known, period);
    if (state.reports >= rule.reportsPerPeriod) return "period";
    const costUnits = units(cost);
    const periodCap = cap(periodBudget);
    const lifetimeCap = cap(lifetimeBudget);
    const refused = (periodCap !== null && state.periodUnits + costUnits > periodCap)
      || (lifetimeCap !== null && state.lifetimeUnits + costUnits > lifetimeCap);
    const spent = refused ? 0 : costUnits;
    this.states.set(rule.name, { period: state.period, reports: state.reports + 1,
      periodUnits: state.periodUnits + spent, lifetimeUnits: state.lifetimeUnits + spent });
    return refused ? "budget" : null;
  }

  /** What was spent, as of `period` (or the mark, when that is later); periodBudget null: the
   * period's reports of `epsilon` each. */
  spent(rule: Rule, period: number, periodBudget: number | null, lifetimeBudget: number, epsilon: number):
    PrivacySpent {
    const s = this.at(this.states.get(rule.name), period);
    const periodCap = cap(periodBudget) ?? rule.reportsPerPeriod * units(epsilon);
    return { metric: rule.name, periodStart: s.period * rule.periodSeconds, periodEnd: (s.period + 1) * rule.periodSeconds,
      reports: s.reports, reportsPerPeriod: rule.reportsPerPeriod, periodEpsilon: s.periodUnits / UNIT,
      periodBudget: periodCap / UNIT, lifetimeEpsilon: s.lifetimeUnits / UNIT, lifetimeBudget };
  }

  /** The state in `period`, never before the mark: a new period starts afresh. */
  private at(state: State | undefined, period: number): State {
    if (state && state.period >= period) return state;
    return { period, reports: 0, periodUnits: 0, lifetimeUnits: state?.lifetimeUnits ?? 0 };
  }
}
