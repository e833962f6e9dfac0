// The time the privacy ledger and the reports use (docs/protocol.md, section 6): the device's clock,
// bounded by the aggregator's. Every specs answer of a revision-2 aggregator carries its clock
// (ServerClock moves it on by the monotonic time since): the device's time is at most that plus
// ALLOWANCE_MS, so a clock set far ahead cannot open future periods. A clock behind is left as it
// is (the ledger's mark keeps it from reopening a period). Before any answer of this Reporter said
// the time (a revision-1 aggregator sends 0; specs from the store before the network answers) the
// device's clock is used as it is.

/** How far a device's time may run ahead of the aggregator's (its error, the answer's time in flight). */
export const ALLOWANCE_MS = 300_000;

/** A clock (Unix milliseconds) reading `wall`, but at most serverNowMs() + ALLOWANCE_MS when the
 * aggregator's time is known (not null). */
export function boundedClock(wall: () => number, serverNowMs: () => number | null): () => number {
  return () => {
    const device = wall();
    const server = serverNowMs();
    return server === null ? device : Math.min(device, server + ALLOWANCE_MS);
  };
}
