// Numeric metrics (docs/protocol.md section 9): a number in a declared range is reported as a
// category of each part the aggregator declares, the mean (alpha-point rounding to one of `levels`
// points) and the distribution (its bucket among `boundaries`), each part a metric of categories
// on the wire. As the Python SDK's veil.mechanism NumericSpec.

import { pythonFloat } from "./canonical.js";
import { VeilUsageError } from "./mechanism.js";

export const NUMERIC_PARTS = ["mean", "distribution"] as const;
export type NumericPart = (typeof NUMERIC_PARTS)[number];
/** The most rounding points of a mean part, and the most buckets of a distribution. */
export const MAX_LEVELS = 64;
const MAX_BUCKETS = 1024;

/** How a number becomes one of a part's categories (MetricSpec.numeric). */
export interface Numeric {
  /** The name apps report the number under (the part's spec is named `<metric>.<part>`). */
  metric: string;
  part: NumericPart;
  low: number;
  high: number;
  /** distribution: strictly increasing, strictly inside (low, high). */
  boundaries: readonly number[];
  /** mean: the number of points, low + j (high - low) / (levels - 1) for j = 0 .. levels - 1. */
  levels: number;
}

/** A number as labels show it: Python's repr without a trailing ".0". */
export function numberText(x: number): string {
  const text = pythonFloat(x);
  return text.endsWith(".0") ? text.slice(0, -2) : text;
}

/** The wire name of a part: `<metric>.<part>`. */
export function partName(numeric: Numeric): string {
  return `${numeric.metric}.${numeric.part}`;
}

/** The part's category labels: each point's value, or each bucket as "[a, b)" (the last "[a, b]"). */
export function numericLabels(numeric: Numeric): string[] {
  const { low, high, levels } = numeric;
  if (numeric.part === "mean") {
    // In this order, as Python computes the points: low + ((high - low) * j) / (levels - 1).
    return Array.from({ length: levels }, (_, j) => numberText(low + (high - low) * j / (levels - 1)));
  }
  const edges = [low, ...numeric.boundaries, high].map(numberText);
  return edges.slice(1).map((b, i) => `[${edges[i]}, ${b}${i === edges.length - 2 ? "]" : ")"}`);
}

/** A part as served, checked as the Python SDK checks it; VeilUsageError when it is not one. */
export function checkNumeric(numeric: Numeric): Numeric {
  const { metric, part, low, high, boundaries, levels } = numeric;
  const finite = (x: unknown) => typeof x === "number" && Number.isFinite(x);
  if (typeof metric !== "string" || !metric) throw new VeilUsageError("A numeric metric needs a non-empty name.");
  if (!NUMERIC_PARTS.includes(part)) throw new VeilUsageError(`A numeric metric's part is mean or distribution, not ${part}.`);
  if (!finite(low) || !finite(high) || !(low < high) || !Number.isFinite(high - low) || !boundaries.every(finite)) {
    throw new VeilUsageError(`Numeric metric ${JSON.stringify(metric)} needs a finite range with low < high.`);
  }
  if (part === "mean" && (boundaries.length > 0 || !Number.isInteger(levels) || levels < 2 || levels > MAX_LEVELS)) {
    throw new VeilUsageError(`The mean of ${JSON.stringify(metric)} needs 2 to ${MAX_LEVELS} points and no boundaries.`);
  }
  if (part === "distribution") {
    const edges = [low, ...boundaries, high];
    if (levels !== 0 || boundaries.length < 1 || boundaries.length >= MAX_BUCKETS
      || edges.slice(1).some((b, i) => !(edges[i] < b))) {
      throw new VeilUsageError(`The distribution of ${JSON.stringify(metric)} needs increasing boundaries inside its range.`);
    }
  }
  if (new Set(numericLabels(numeric)).size !== (part === "mean" ? levels : boundaries.length + 1)) {
    throw new VeilUsageError(`Numeric metric ${JSON.stringify(metric)}: its points or buckets are too close together.`);
  }
  return numeric;
}

/** The number within the range, and whether it had to be moved there (NaN and infinities are
 * refused before: misuse, not data). */
export function clip(numeric: Numeric, x: number): [number, boolean] {
  if (x < numeric.low) return [numeric.low, true];
  if (x > numeric.high) return [numeric.high, true];
  return [x, false];
}

/** The category of a number already in the range, for a device whose rounding threshold is alpha
 * in [0, 1) (the mean only). mean: t = (x - low) / (high - low) * G in doubles, in this order,
 * j = min(floor(t), G - 1), j + 1 when t - j > alpha; distribution: the boundaries at or below x. */
export function numericCategory(numeric: Numeric, x: number, alpha: number): number {
  if (numeric.part === "mean") {
    const steps = numeric.levels - 1;
    const t = (x - numeric.low) / (numeric.high - numeric.low) * steps;
    const j = Math.min(Math.floor(t), steps - 1);
    // + 0: x = -0.0 would give the category -0.
    return (t - j > alpha ? j + 1 : j) + 0;
  }
  let below = 0;
  for (const b of numeric.boundaries) if (b <= x) below += 1;
  return below;
}
