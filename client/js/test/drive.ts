// A Reporter driven by JSON lines on stdin, answering JSON lines on stdout: Python's tests run it
// against real aggregators (tests/aggregator/test_js_reporter.py).
//   node dist/test/drive.js '{"http": "http://127.0.0.1:8080"}'   or '{"grpc": "127.0.0.1:50051"}'
//   options beside: token, store (a directory), memoize, scheduleDelayMs, retry backoffs
// Commands: {"do": "report", "metric": m, "value": v, "n": n} (no answer), {"do": "flush",
// "timeoutMs": t}, {"do": "shutdown", "timeoutMs": t}: {"ok": bool, "counters": {...}};
// {"do": "spent", "metric": m}: the PrivacySpent.
import { createInterface } from "node:readline";

import { Reporter, type ReporterOptions } from "../src/index.js";
import { GrpcTransport, nodeFileStore } from "../src/node.js";

const given = JSON.parse(process.argv[2]);
const options: ReporterOptions = { ...given, log: (message: string) => process.stderr.write(`${message}\n`) };
if (given.grpc) options.transport = new GrpcTransport(given.grpc, { token: given.token, tls: false });
else options.endpoint = given.http;
if (given.store) options.store = nodeFileStore(given.store);
const reporter = new Reporter(options);

const say = (answer: unknown) => process.stdout.write(`${JSON.stringify(answer)}\n`);
for await (const line of createInterface({ input: process.stdin })) {
  const command = JSON.parse(line);
  if (command.do === "report") {
    for (let i = 0; i < (command.n ?? 1); i++) reporter.report(command.metric, command.value);
  } else if (command.do === "flush" || command.do === "shutdown") {
    const ok = await reporter[command.do as "flush" | "shutdown"](command.timeoutMs);
    say({ ok, counters: reporter.counters() });
  } else if (command.do === "spent") {
    say(reporter.privacySpent(command.metric) ?? null);
  }
}
