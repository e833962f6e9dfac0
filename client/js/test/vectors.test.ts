// The shared test vectors (proto/veil/wire/v1/vectors, made by proto/vectors.py from the Python
// SDK): this SDK must reproduce every one.
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  canonicalJson, design, encodeUpload, encodeUploads, fingerprint, GivenWords, Memo, randomize, uploadJson, usesBitmaps,
} from "../src/index.js";

const VECTORS = new URL("../../../../proto/veil/wire/v1/vectors/", import.meta.url);

// eslint-disable-next-line @typescript-eslint/no-explicit-any
function load(name: string): any[] {
  const file = JSON.parse(readFileSync(new URL(name, VECTORS), "utf8"));
  assert.equal(file.version, "v1");
  assert.ok(file.vectors.length > 0);
  return file.vectors;
}

interface SpecJson {
  name: string; labels: string[]; mechanism: string; k: number; epsilon: number; period: number;
  reports_per_period: number;
}

const canonical = (s: SpecJson) => ({
  name: s.name, labels: s.labels, mechanism: s.mechanism, k: s.k, epsilon: s.epsilon, period: s.period,
  reportsPerPeriod: s.reports_per_period,
});

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");

test("fingerprints: canonical JSON and digest", async () => {
  for (const v of load("fingerprints.json")) {
    assert.equal(canonicalJson(canonical(v.spec)), v.canonical_json);
    assert.equal(await fingerprint(canonical(v.spec)), v.fingerprint);
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
  const d = design(v.spec.mechanism, v.spec.k, v.spec.epsilon);
  assert.equal(usesBitmaps(d) ? "bitmaps" : "index_sets", v.encoding);
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
