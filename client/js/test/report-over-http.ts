// End to end for the Python tests: fetch the specs from an aggregator, randomize n reports of
// each true value given on the command line with the platform CSPRNG, upload them in batches of
// 100, and print what was accepted per metric as JSON.
//   node dist/test/report-over-http.js <url> <token or -> <metric>=<value>x<n> ...
import { fetchSpecs, randomize, SystemWords, uploadBatch } from "../src/index.js";

const [url, token, ...wanted] = process.argv.slice(2);
const endpoint = { url, token: token === "-" ? undefined : token };
const { metrics } = await fetchSpecs(endpoint);
const words = new SystemWords();
const accepted: Record<string, number> = {};
for (const item of wanted) {
  const [name, rest] = item.split("=");
  const [value, n] = rest.split("x").map(Number);
  const metric = metrics.find((m) => m.name === name);
  if (!metric) throw new Error(`no spec for ${name}`);
  for (let done = 0; done < n; done += 100) {
    const reports = Array.from({ length: Math.min(100, n - done) }, () => randomize(metric.design, value, words));
    const result = await uploadBatch(endpoint, metric, reports, { initialMs: 50 });
    if (result.status !== 200) throw new Error(`upload answered ${result.status}`);
    accepted[name] = (accepted[name] ?? 0) + result.accepted;
  }
}
process.stdout.write(JSON.stringify(accepted));
