// UploadRequest on the wire (docs/protocol.md, "Encodings"): protobuf written by hand, so the SDK
// needs no protobuf runtime; fields in number order, defaults left out, as protoc's writers do.

import type { Design } from "./mechanism.js";

/** True when the design's reports travel as bitmaps: RAPPOR always, a q-subset design when
 * ceil(k/8) bytes per report is less than its 4q bytes of indices (a hashed design's travel as
 * words: HashedReports). */
export function usesBitmaps(d: Design): boolean {
  return d.mechanism !== "hashed" && (d.q === 0 || Math.ceil(d.k / 8) < 4 * d.q);
}

type Encoding = "bitmaps" | "index_sets" | "hashed";

function encodingOf(d: Design): Encoding {
  if (d.mechanism === "hashed") return "hashed";
  return usesBitmaps(d) ? "bitmaps" : "index_sets";
}

class Writer {
  private parts: number[] = [];

  varint(value: number): this {
    let v = value;
    while (v >= 0x80) {
      this.parts.push((v % 0x80) | 0x80);
      v = Math.floor(v / 0x80);
    }
    this.parts.push(v);
    return this;
  }

  bytes(field: number, payload: Uint8Array): this {
    this.varint((field << 3) | 2).varint(payload.length);
    for (const b of payload) this.parts.push(b);
    return this;
  }

  uint(field: number, value: number): this {
    return value === 0 ? this : this.varint(field << 3).varint(value);
  }

  done(): Uint8Array {
    return Uint8Array.from(this.parts);
  }
}

/** The report columns: count * q little-endian uint32 indices, count * ceil(k/8) bitmap bytes, or
 * (hashed) count * 10 little-endian uint32 words. */
export function reportBytes(d: Design, reports: readonly (readonly number[])[]): Uint8Array {
  if (encodingOf(d) === "bitmaps") {
    const width = Math.ceil(d.k / 8);
    const out = new Uint8Array(width * reports.length);
    reports.forEach((report, r) => {
      for (const j of report) out[r * width + (j >> 3)] |= 1 << (j & 7);
    });
    return out;
  }
  const out = new Uint8Array(4 * reports.reduce((n, report) => n + report.length, 0));
  const view = new DataView(out.buffer);
  let at = 0;
  for (const report of reports) for (const j of report) { view.setUint32(at, j, true); at += 4; }
  return out;
}

/** The serialized UploadRequest of reports randomized under a spec (its name and fingerprint) in the
 * time slot starting at madeUnix (Unix seconds; 0: not said). */
export function encodeUpload(d: Design, metric: string, fingerprint: string, reports: readonly (readonly number[])[],
                             batchId: Uint8Array, madeUnix = 0): Uint8Array {
  const text = new TextEncoder();
  const columns = reportBytes(d, reports);
  const encoding = encodingOf(d);
  // IndexSets (5): set_size 1, indices 2; Bitmaps (6): bits 1; HashedReports (8): words 1.
  const inner = encoding === "index_sets" ? new Writer().uint(1, d.q).bytes(2, columns) : new Writer().bytes(1, columns);
  const writer = new Writer()
    .bytes(1, batchId)
    .bytes(2, text.encode(metric))
    .bytes(3, text.encode(fingerprint))
    .uint(4, reports.length);
  // In field number order: made_unix (7) before the hashed reports (8).
  if (encoding === "hashed") return writer.uint(7, madeUnix).bytes(8, inner.done()).done();
  return writer.bytes(encoding === "bitmaps" ? 6 : 5, inner.done()).uint(7, madeUnix).done();
}

/** The serialized UploadBatchesRequest of serialized UploadRequests: each a field 1, in order. */
export function encodeUploads(uploads: readonly Uint8Array[]): Uint8Array {
  const writer = new Writer();
  for (const upload of uploads) writer.bytes(1, upload);
  return writer.done();
}

function base64(bytes: Uint8Array): string {
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text);
}

/** The same UploadRequest in the proto3 JSON mapping (for POST /v1/upload as application/json; an
 * int64 such as madeUnix is a decimal string there). */
export function uploadJson(d: Design, metric: string, fingerprint: string, reports: readonly (readonly number[])[],
                           batchId: Uint8Array, madeUnix = 0): Record<string, unknown> {
  const columns = base64(reportBytes(d, reports));
  const encoded = { bitmaps: { bitmaps: { bits: columns } }, index_sets: { indexSets: { setSize: d.q, indices: columns } },
    hashed: { hashed: { words: columns } } }[encodingOf(d)];
  return {
    batchId: base64(batchId),
    metric,
    specFingerprint: fingerprint,
    count: reports.length,
    ...encoded,
    ...(madeUnix ? { madeUnix: String(madeUnix) } : {}),
  };
}
