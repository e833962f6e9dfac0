// The synchronous SHA-256 and HMAC that key the memo, against node:crypto.
import { strict as assert } from "node:assert";
import { createHash, createHmac, randomBytes } from "node:crypto";
import { test } from "node:test";

import { hmacSha256, sha256 } from "../src/index.js";

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

test("sha256 and hmacSha256 agree with node:crypto at every length around the block edges", () => {
  for (let n = 0; n < 200; n++) {
    const data = randomBytes(n);
    assert.equal(hex(sha256(data)), createHash("sha256").update(data).digest("hex"), `length ${n}`);
    const key = randomBytes(n % 3 === 0 ? 100 : 32);  // keys beyond a block are hashed first
    assert.equal(hex(hmacSha256(key, data)), createHmac("sha256", key).update(data).digest("hex"), `length ${n}`);
  }
});
