// The shared test vectors (proto/veil/wire/v1/vectors, made by proto/vectors.py from the Python
// SDK): this SDK must reproduce every one.
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  canonicalJson, design, encodeUpload, fingerprint, GivenWords, randomize, uploadJson, usesBitmaps,
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

test("encodings: protobuf bytes and the proto3 JSON mapping", async () => {
  for (const v of load("encodings.json")) {
    const d = design(v.spec.mechanism, v.spec.k, v.spec.epsilon);
    assert.equal(usesBitmaps(d) ? "bitmaps" : "index_sets", v.encoding);
    const fp = await fingerprint(canonical(v.spec));
    assert.equal(fp, v.fingerprint);
    const id = Buffer.from(v.batch_id, "hex");
    assert.equal(hex(encodeUpload(d, v.spec.name, fp, v.reports, id)), v.upload_hex);
    assert.deepEqual(uploadJson(d, v.spec.name, fp, v.reports, id), v.upload_json);
  }
});
