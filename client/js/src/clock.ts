// The time the privacy ledger and the reports use (docs/protocol.md, section 6): the device's clock,
// bounded by the aggregator's. Every specs answer of a revision-2 aggregator carries its clock
// (serverTimeUnix); from then on the device's time is at most that clock plus the monotonic time
// elapsed since the answer, plus ALLOWANCE_MS, so a clock set far ahead cannot open future
// periods. A clock behind is left as it is (the ledger's mark keeps it from reopening a period).
// Before any answer of this Reporter said the time (a revision-1 aggregator sends 0; specs from
// the store before the network answers) the device's clock is used as it is.

/** How far a device's time may run ahead of the aggregator's last word (its error, the answer's
 * time in flight). */
export const ALLOWANCE_MS = 300_000;

export class BoundedClock {
  /** [the aggregator's Unix milliseconds, the monotonic milliseconds it arrived]. */
  private said: [number, number] | null = null;

  /** wall: Unix milliseconds (Date.now); monotonic: milliseconds from any origin (performance.now). */
  constructor(private readonly wall: () => number = Date.now,
              private readonly monotonic: () => number = () => performance.now()) {}

  /** Record the aggregator's clock (Unix seconds) from a specs answer; 0 (not said) keeps what was. */
  observe(serverTimeUnix: number): void {
    if (serverTimeUnix > 0) this.said = [serverTimeUnix * 1000, this.monotonic()];
  }

  /** Unix milliseconds now: the device's clock, at most the aggregator's plus what elapsed since. */
  now(): number {
    const wall = this.wall();
    if (this.said === null) return wall;
    return Math.min(wall, this.said[0] + (this.monotonic() - this.said[1]) + ALLOWANCE_MS);
  }
}
