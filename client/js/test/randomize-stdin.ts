// Reads cases {mechanism, k, epsilon, value, words} as a JSON array on stdin and writes their
// reports as a JSON array: Python's tests drive this SDK's randomizer with their own words.
import { readFileSync } from "node:fs";

import { design, GivenWords, randomize } from "../src/index.js";

interface Case { mechanism: string; k: number; epsilon: number; value: number; words: number[] }

const cases: Case[] = JSON.parse(readFileSync(0, "utf8"));
const out = cases.map((c) => {
  const d = design(c.mechanism, c.k, c.epsilon);
  const source = new GivenWords(c.words);
  return { report: randomize(d, c.value, source), used: source.position };
});
process.stdout.write(JSON.stringify(out));
