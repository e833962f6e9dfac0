// @veil/client: Veil's TypeScript SDK (the v1 wire contract, docs/protocol.md). Node's file store
// and gRPC are in "@veil/client/node".
export { canonicalJson, designSpec, fingerprint, pythonFloat, type CanonicalSpec } from "./canonical.js";
export { below, bernoulli, bits64, choose, GivenWords, SystemWords, type WordSource } from "./random.js";
export {
  checkEpsilon, design, EPSILON_RANGE, epsilonToGamma, MECHANISMS, minimaxQ, randomize, VeilUsageError,
  type Design, type Mechanism,
} from "./mechanism.js";
export { encodeUpload, encodeUploads, reportBytes, uploadJson, usesBitmaps } from "./encode.js";
export {
  checkNumeric, clip, MAX_LEVELS, NUMERIC_PARTS, numberText, numericCategory, numericLabels, partName, type Numeric,
  type NumericPart,
} from "./numeric.js";
export {
  candidateCount, candidates, checkStrings, CODE_BYTES, codeText, HASHED, hashedDesign, hashedSupport, MODULUS,
  prefixBytes, prefixHash, randomizeHashed, REPORT_WORDS, roundName, ROUNDS, stringCode, type Strings,
} from "./strings.js";
export { parseSpecs, ServerClock, type Metric } from "./specs.js";
export { fetchSpecs, HttpTransport, type Endpoint } from "./http.js";
export {
  backoffMs, RETRY_HORIZON_MS, type Batch, type Outcome, type Sent, type SpecsAnswer, type Transport,
} from "./transport.js";
export { Ledger, type PrivacySpent, type Refusal, type Rule } from "./ledger.js";
export { Memo } from "./memo.js";
export { MemoryStore, type DeviceStore } from "./store.js";
export { browserStore } from "./browser-store.js";
export { hmacSha256, sha256 } from "./sha256.js";
export {
  Reporter, UnknownCategoryError, UnknownMetricError, type Counters, type ReporterOptions,
} from "./reporter.js";
