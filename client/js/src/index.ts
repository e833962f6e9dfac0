// @veil/client: Veil's TypeScript SDK (the v1 wire contract, docs/protocol.md).
export { canonicalJson, fingerprint, pythonFloat, type CanonicalSpec } from "./canonical.js";
export { below, bernoulli, bits64, choose, GivenWords, SystemWords, type WordSource } from "./random.js";
export {
  checkEpsilon, design, EPSILON_RANGE, epsilonToGamma, MECHANISMS, minimaxQ, randomize, VeilUsageError,
  type Design, type Mechanism,
} from "./mechanism.js";
export { encodeUpload, reportBytes, uploadJson, usesBitmaps } from "./encode.js";
export { fetchSpecs, uploadBatch, type Endpoint, type Metric, type UploadResult } from "./http.js";
export { Ledger, MemoryStore, type KeyValueStore, type Rule } from "./ledger.js";
