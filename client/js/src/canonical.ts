// The spec's canonical form and fingerprint (docs/protocol.md, "Fingerprints"): JSON with sorted
// keys and no spaces, numbers spelled as Python's repr spells them, UTF-8, SHA-256, 32 hex digits.

import type { Numeric } from "./numeric.js";
import { hex, sha256 } from "./sha256.js";
import { stringsJson, type Strings } from "./strings.js";

export interface CanonicalSpec {
  name: string;
  labels: readonly string[];
  mechanism: string;
  k: number;
  epsilon: number;
  period: number;
  reportsPerPeriod: number;
  /** A part of a numeric metric (revision 3): in the canonical form only when set, so the
   * fingerprints of metrics of categories are what they were. */
  numeric?: Numeric;
  /** A round of a strings metric (revision 4): in the canonical form only when set, as the last
   * key; its labels are then written empty (the candidates follow from its parents). */
  strings?: Strings;
}

/** A double as Python's repr() writes it: the shortest digits that read back to the same double,
 * in fixed notation for decimal exponents -4..15 (with ".0" when there is no fraction), otherwise
 * d.ddde+XX with a signed exponent of at least two digits. */
export function pythonFloat(x: number): string {
  if (!Number.isFinite(x)) throw new RangeError(`${x} has no JSON spelling.`);
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  // toExponential() without an argument gives the shortest round-trip digits.
  const [mantissa, exp] = Math.abs(x).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const e = Number(exp);
  if (e >= -4 && e < 16) {
    if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
    const whole = digits.slice(0, e + 1).padEnd(e + 1, "0");
    const fraction = digits.slice(e + 1);
    return `${sign}${whole}.${fraction || "0"}`;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
}

/** The canonical JSON text of a spec: the text its fingerprint digests. */
export function canonicalJson(spec: CanonicalSpec): string {
  // JSON.stringify escapes strings as Python's json.dumps(ensure_ascii=False) does: \" \\ \b \f
  // \n \r \t, other controls as \u00xx, everything else as itself.
  const s = JSON.stringify;
  const labels = spec.strings ? [] : spec.labels;
  return `{"epsilon":${pythonFloat(spec.epsilon)},"k":${spec.k},"labels":[${labels.map((l) => s(l)).join(",")}],` +
    `"mechanism":${s(spec.mechanism)},"name":${s(spec.name)},${spec.numeric ? numericJson(spec.numeric) : ""}` +
    `"period":${spec.period},"reports_per_period":${spec.reportsPerPeriod}` +
    `${spec.strings ? `,"strings":${stringsJson(spec.strings)}` : ""}}`;
}

/** `"numeric":{...},`: the part's canonical object, its keys sorted, every bound a double. */
function numericJson(n: Numeric): string {
  return `"numeric":{"boundaries":[${n.boundaries.map(pythonFloat).join(",")}],"high":${pythonFloat(n.high)},` +
    `"levels":${n.levels},"low":${pythonFloat(n.low)},"metric":${JSON.stringify(n.metric)},` +
    `"part":${JSON.stringify(n.part)}},`;
}

/** A strings round's design: its spec with no parents, and so k 0 (docs/protocol.md section 10):
 * what its reports depend on, the same period after period; its fingerprint keys the round's memo. */
export function designSpec(spec: CanonicalSpec): CanonicalSpec {
  if (!spec.strings) throw new RangeError(`${spec.name} is not a round of a strings metric.`);
  return { ...spec, k: 0, strings: { ...spec.strings, parents: [] } };
}

/** The spec's fingerprint: the first 32 hex digits of SHA-256 of its canonical JSON (UTF-8). */
export function fingerprint(spec: CanonicalSpec): string {
  return hex(sha256(new TextEncoder().encode(canonicalJson(spec)))).slice(0, 32);
}
