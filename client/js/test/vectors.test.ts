// The shared test vectors (proto/veil/wire/v1/vectors, made by proto/vectors.py from the Python
// SDK): this SDK must reproduce every one.
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  candidates, canonicalJson, checkNumeric, checkStrings, clip, CODE_BYTES, codeText, design, designSpec, encodeUpload,
  encodeUploads, fingerprint, GivenWords, hashedDesign, hashedSupport, Memo, numericCategory, numericLabels, parseSpecs,
  partName, prefixBytes, randomize, randomizeHashed, REPORT_WORDS, ROUNDS, stringCode, uploadJson, usesBitmaps,
  type Design, type Numeric, type Strings,
} from "../src/index.js";
import { servedNumeric, servedStrings } from "./collector.js";

const VECTORS = new URL("../../../../proto/veil/wire/v1/vectors/", import.meta.url);

// eslint-disable-next-line @typescript-eslint/no-explicit-any
function load(name: string): any[] {
  const file = JSON.parse(readFileSync(new URL(name, VECTORS), "utf8"));
  assert.equal(file.version, "v1");
  assert.ok(file.vectors.length > 0);
  return file.vectors;
}

interface StringsJson { metric: string; round: number; rounds: number; buckets: number; parents: string[] }

interface SpecJson {
  name: string; labels: string[]; mechanism: string; k: number; epsilon: number; period: number;
  reports_per_period: number; numeric?: Numeric; strings?: StringsJson;
}

const bytes = (h: string) => new Uint8Array(Buffer.from(h, "hex"));
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

/** A strings round as the vectors write it (parents as hex), checked. */
const stringsOf = (s: StringsJson): Strings => checkStrings({ ...s, parents: s.parents.map(bytes) });

const canonical = (s: SpecJson) => ({
  name: s.name, labels: s.labels, mechanism: s.mechanism, k: s.k, epsilon: s.epsilon, period: s.period,
  reportsPerPeriod: s.reports_per_period, ...(s.numeric ? { numeric: s.numeric } : {}),
  ...(s.strings ? { strings: stringsOf(s.strings) } : {}),
});

/** A vector spec's design: a strings round's hashed over its candidates and buckets. */
const designOf = (s: SpecJson): Design =>
  (s.strings ? hashedDesign(s.k, s.epsilon, s.strings.buckets) : design(s.mechanism, s.k, s.epsilon));

test("fingerprints: canonical JSON and digest", async () => {
  for (const v of load("fingerprints.json")) {
    assert.equal(canonicalJson(canonical(v.spec)), v.canonical_json);
    assert.equal(await fingerprint(canonical(v.spec)), v.fingerprint);
  }
});

test("numeric fingerprints: the part's name, labels and k derived from its numeric spec", async () => {
  const parts = load("fingerprints.json").filter((v) => v.spec.numeric);
  assert.ok(parts.some((v) => v.spec.numeric.part === "mean") && parts.some((v) => v.spec.numeric.part === "distribution"));
  assert.ok(parts.some((v) => /e[-+]\d\d/.test(v.canonical_json)), "exponent forms are covered");
  for (const v of parts) {
    const numeric = checkNumeric(v.spec.numeric);
    assert.equal(partName(numeric), v.spec.name);
    assert.deepEqual(numericLabels(numeric), v.spec.labels);
    assert.equal(v.spec.k, v.spec.labels.length);
    // As served (proto3 JSON: defaults absent, enum names), each part is used: its fingerprint reproduced.
    const served = { name: v.spec.name, labels: v.spec.labels, mechanism: v.spec.mechanism.toUpperCase(),
      epsilon: v.spec.epsilon, q: design(v.spec.mechanism, v.spec.k, v.spec.epsilon).q, fingerprint: v.fingerprint,
      periodSeconds: v.spec.period, reportsPerPeriod: v.spec.reports_per_period,
      numeric: servedNumeric(numeric) };
    const { metrics } = parseSpecs({ specs: [served] });
    assert.deepEqual(metrics.map((m) => [m.name, m.fingerprint, m.numeric]), [[v.spec.name, v.fingerprint, numeric]]);
    // A part whose labels, name or range are not its numeric spec's is refused.
    for (const wrong of [{ labels: [...v.spec.labels.slice(1), "x"] }, { name: `${v.spec.name}x` },
      { numeric: { ...served.numeric, high: numeric.high * 2 } }, { numeric: { ...served.numeric, part: "NUMERIC_MEDIAN" } }]) {
      assert.deepEqual(parseSpecs({ specs: [{ ...served, ...wrong }] }).metrics, [], JSON.stringify(wrong));
    }
  }
});

test("numeric_values: a number clipped to the range and its category, for given alphas", () => {
  const vectors = load("numeric_values.json");
  assert.ok(vectors.some((v) => v.clipped) && vectors.some((v) => Object.is(v.value, -0)));
  for (const v of vectors) {
    const numeric = checkNumeric(v.numeric);
    const [x, clipped] = clip(numeric, v.value);
    const where = `${numeric.metric}.${numeric.part} value=${v.value} alpha=${v.alpha}`;
    assert.ok(Object.is(x, v.clipped_value), where);
    assert.equal(clipped, v.clipped, where);
    assert.ok(Object.is(numericCategory(numeric, x, v.alpha), v.category), where);
  }
});

test("numeric_alphas: the rounding threshold from the device secret", () => {
  for (const v of load("numeric_alphas.json")) {
    const alpha = new Memo(Buffer.from(v.secret, "hex")).alpha(v.metric, v.fingerprint);
    assert.equal(alpha, v.alpha);
    assert.equal(alpha * 2 ** 53, v.alpha_53);
  }
});

test("thresholds: gamma, q and the integer threshold of every design", () => {
  for (const v of load("thresholds.json")) {
    const d = design(v.mechanism, v.k, v.epsilon);
    const where = `${v.mechanism} k=${v.k} epsilon=${v.epsilon}`;
    assert.equal(d.gamma, Number(v.gamma), where);
    assert.equal(d.q, v.q, where);
    assert.equal(d.threshold, BigInt(v.q ? v.keep_threshold : v.flip_threshold), where);
  }
});

test("randomize: the same words give the same report, using every word", () => {
  for (const v of load("randomize.json")) {
    const source = new GivenWords(v.words);
    const report = randomize(design(v.mechanism, v.k, v.epsilon), v.value, source);
    assert.deepEqual(report, v.report, `${v.note}: ${v.mechanism} k=${v.k} epsilon=${v.epsilon} value=${v.value}`);
    assert.equal(source.position, v.words.length);
  }
});

// eslint-disable-next-line @typescript-eslint/no-explicit-any
async function checkUpload(v: any): Promise<Uint8Array> {
  const d = designOf(v.spec);
  assert.equal(d.mechanism === "hashed" ? "hashed" : usesBitmaps(d) ? "bitmaps" : "index_sets", v.encoding);
  const fp = await fingerprint(canonical(v.spec));
  assert.equal(fp, v.fingerprint);
  const id = Buffer.from(v.batch_id, "hex");
  const bytes = encodeUpload(d, v.spec.name, fp, v.reports, id, v.made_unix);
  assert.equal(hex(bytes), v.upload_hex);
  assert.deepEqual(uploadJson(d, v.spec.name, fp, v.reports, id, v.made_unix), v.upload_json);
  return bytes;
}

test("encodings: protobuf bytes and the proto3 JSON mapping, made_unix included", async () => {
  const vectors = load("encodings.json");
  assert.ok(vectors.some((v) => v.made_unix === 0) && vectors.some((v) => v.made_unix > 2 ** 32));
  assert.ok(vectors.some((v) => v.encoding === "hashed"));
  for (const v of vectors) await checkUpload(v);
});

test("upload_batches: several UploadRequests in one UploadBatchesRequest", async () => {
  for (const v of load("upload_batches.json")) {
    const uploads = [];
    for (const batch of v.batches) uploads.push(await checkUpload(batch));
    assert.equal(hex(encodeUploads(uploads)), v.request_hex);
    assert.deepEqual({ batches: v.batches.map((b: { upload_json: unknown }) => b.upload_json) }, v.request_json);
  }
});

test("memo_keys: HMAC-SHA256 over lengths in bytes of UTF-8", () => {
  for (const v of load("memo_keys.json")) {
    assert.equal(new Memo(Buffer.from(v.secret, "hex")).key(v.metric, v.fingerprint, v.category), v.key);
  }
});

test("strings fingerprints: a round's k from its parents, used as served (proto3 JSON, parents as base64)", () => {
  const rounds = load("fingerprints.json").filter((v) => v.spec.strings);
  assert.ok(rounds.some((v) => v.spec.strings.round === 0) && rounds.some((v) => v.spec.strings.round === ROUNDS - 1));
  for (const v of rounds) {
    const strings = stringsOf(v.spec.strings);
    const served = { name: v.spec.name, mechanism: "HASHED", epsilon: v.spec.epsilon, fingerprint: v.fingerprint,
      periodSeconds: v.spec.period, reportsPerPeriod: v.spec.reports_per_period, strings: servedStrings(strings) };
    const { metrics } = parseSpecs({ specs: [served] });
    assert.deepEqual(metrics.map((m) => [m.name, m.fingerprint, m.design.k, m.design.buckets, m.memoDesign]),
      [[v.spec.name, v.fingerprint, v.spec.k, v.spec.strings.buckets, fingerprint(designSpec(canonical(v.spec)))]],
      v.spec.name);
    assert.equal(candidates(strings).length, v.spec.k);
    // Without its strings round (a revision-3 client's view) the spec is refused.
    assert.deepEqual(parseSpecs({ specs: [{ ...served, strings: undefined }] }).metrics, []);
  }
});

test(`strings_codes: a string's (or bytes') ${CODE_BYTES}-byte code and how it is shown`, () => {
  const vectors = load("strings_codes.json");
  assert.ok(vectors.some((v) => v.bytes_hex !== undefined) && vectors.some((v) => v.code.startsWith("ff")));
  for (const v of vectors) {
    const where = JSON.stringify(v.string ?? v.bytes_hex);
    if (v.string !== undefined) assert.equal(hex(new TextEncoder().encode(v.string)), v.utf8_hex, where);
    const code = stringCode(v.string ?? bytes(v.bytes_hex));
    assert.equal(code.length, CODE_BYTES, where);
    assert.equal(hex(code), v.code, where);
    assert.equal(codeText(code), v.shown, where);
  }
});

test("strings_rounds: the device's round from its secret", () => {
  const vectors = load("strings_rounds.json");
  assert.equal(new Set(vectors.map((v) => v.round)).size, ROUNDS, "every round is covered");
  for (const v of vectors) assert.equal(new Memo(bytes(v.secret)).round(v.metric), v.round, `${v.secret} ${v.metric}`);
});

test(`hashed_randomize: the same words give the same ${REPORT_WORDS} words, using every word`, () => {
  const vectors = load("hashed_randomize.json");
  assert.ok(["kept", "not kept", "below() rejections"].every((note) => vectors.some((v) => v.note === note)));
  for (const v of vectors) {
    const where = `${v.note}: ${v.spec.name} epsilon=${v.spec.epsilon} code=${v.code}`;
    assert.equal(fingerprint(canonical(v.spec)), v.fingerprint, where);
    const d = designOf(v.spec);
    assert.equal(d.threshold, BigInt(v.keep_threshold), where);
    const prefix = bytes(v.code).subarray(0, prefixBytes(stringsOf(v.spec.strings)));
    assert.equal(hex(prefix), v.prefix, where);
    const source = new GivenWords(v.words);
    assert.equal(v.report.length, REPORT_WORDS, where);
    assert.deepEqual(randomizeHashed(d, prefix, source), v.report, where);
    assert.equal(source.position, v.words.length, where);
  }
});

test("hashed_support: the candidates each report holds", () => {
  for (const v of load("hashed_support.json")) {
    const all = candidates(stringsOf(v.spec.strings));
    assert.equal(all.length, v.spec.k);
    assert.deepEqual(v.reports.map((r: number[]) => hashedSupport(r, all, v.buckets)), v.supported, v.spec.name);
  }
});

test("strings_memo_keys: the round's design (no parents, k 0) and the HMAC of round name, design and prefix", () => {
  for (const v of load("strings_memo_keys.json")) {
    const spec = designSpec(canonical(v.spec));
    assert.equal(canonicalJson(spec), v.design_canonical_json);
    assert.equal(fingerprint(spec), v.design);
    assert.equal(new Memo(bytes(v.secret)).stringsKey(v.spec.name, v.design, bytes(v.prefix)), v.key, v.spec.name);
  }
});
