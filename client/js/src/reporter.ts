// The Reporter: report() randomizes at the call (memoized responses, the device ledger) and
// returns; batches are made per metric, spec and time slot (maxBatchSize reports or
// scheduleDelayMs; each says when its reports were made) and uploaded in the background, the due
// ones together (one UploadBatches call of up to 64 batches and max_batch reports, or one Upload per
// batch to a revision-1 aggregator), each retried with the same batch id until the aggregator
// acknowledges it, refuses it for good, or the retry horizon passes. Specs are fetched at start,
// again when an upload answer names another specs version, and otherwise checked every specTtlMs
// with the version held (the aggregator answers "unchanged" at almost no cost). A number reported
// under a numeric metric's name is reported as a category of each of its parts (numeric.ts); a
// string under a strings metric's name is reported in the one round this device answers
// (strings.ts), and waits while that round is not served.

import { boundedClock } from "./clock.js";
import { DeviceState } from "./device.js";
import { HttpTransport } from "./http.js";
import type { PrivacySpent, Refusal } from "./ledger.js";
import { randomize, VeilUsageError } from "./mechanism.js";
import { clip, numericCategory } from "./numeric.js";
import { SystemWords, type WordSource } from "./random.js";
import { parseSpecs, ServerClock, type Metric } from "./specs.js";
import { MemoryStore, type DeviceStore } from "./store.js";
import { prefixBytes, randomizeHashed, roundName, stringCode } from "./strings.js";
import { backoffMs, RETRY_HORIZON_MS, type Batch, type Transport } from "./transport.js";

/** The most batches one upload call carries (docs/protocol.md, UploadBatches). */
const BATCHES_PER_CALL = 64;

/** A metric name that is not a string. */
export class UnknownMetricError extends VeilUsageError {
  override name = "UnknownMetricError";
}

/** A value that is neither a category label, a category index from 0 up, a finite number nor bytes
 * (once the specs are known, a value not of the metric's kind is dropped and counted instead). */
export class UnknownCategoryError extends VeilUsageError {
  override name = "UnknownCategoryError";
}

export interface ReporterOptions {
  /** The aggregator's HTTP listener, e.g. "https://veil.example.com:8080" (or give transport). */
  endpoint?: string;
  /** Sent as `authorization: Bearer <token>` over HTTP. */
  token?: string;
  /** Another wire: new GrpcTransport(address, options) from "@veil/client/node". */
  transport?: Transport;
  /** Where the device keeps its secret, memo, ledger and last specs: nodeFileStore(dir) in Node,
   * browserStore() in browsers; default memory (each start is a new device). */
  store?: DeviceStore | Promise<DeviceStore>;
  maxQueueSize?: number;
  maxBatchSize?: number;
  scheduleDelayMs?: number;
  exportTimeoutMs?: number;
  specTtlMs?: number;
  retryInitialBackoffMs?: number;
  retryMaxBackoffMs?: number;
  /** true (default), false, or per metric: { metric: false } (a numeric metric's name: both parts;
   * a strings metric's name: its rounds). */
  memoize?: boolean | Record<string, boolean>;
  /** Lower the aggregator's budgets (epsilon), for all metrics or per metric (a numeric metric's
   * part by its name, e.g. "load_ms.mean"; a strings metric by its name or its round's); never
   * raise them. */
  periodBudget?: number | Record<string, number>;
  lifetimeBudget?: number | Record<string, number>;
  /** The random words; the platform CSPRNG by default. Anything else is for tests only. */
  words?: WordSource;
  /** Unix milliseconds now (reporting periods); Date.now by default. Anything else is for tests only. */
  clock?: () => number;
  /** Where the SDK's few log lines go (counts and reasons, never values or tokens). */
  log?: (message: string) => void;
}

/** A snapshot of the Reporter's counts, in reports unless said otherwise (as the Python SDK's). */
export interface Counters {
  /** report() calls randomized and queued. */
  accepted: number;
  /** Reports discarded on the device: a full queue, a metric or category the aggregator does not
   * declare, a Reporter shut down, a store that cannot record the spending, or left at shutdown. */
  dropped: number;
  /** Reports the aggregator acknowledged (a duplicate acknowledgement included). */
  sent: number;
  /** Upload attempts (batches) repeated after a retryable failure. */
  retried: number;
  /** Reports in batches refused for good or unacknowledged past the retry horizon. */
  failed: number;
  /** Reports awaiting acknowledgement now (and calls waiting for the first specs, or for their
   * strings metric's round). */
  queued: number;
  /** Reports in batches refused for good as made longer ago than the aggregator accepts. */
  tooLate: number;
  /** Calls not sent because this period's reports of the metric were sent already, or because the
   * period is before one the device reported in (its clock was set back). */
  limited: number;
  /** Calls not sent because they would exceed the metric's period or lifetime budget. */
  overBudget: number;
  /** Calls not sent because the ledger could not be written to the device store (their spending
   * could not be recorded). */
  ledgerUnavailable: number;
  /** Numbers reported outside their numeric metric's range, reported as its nearest end (calls,
   * not parts). */
  clipped: number;
}

interface Open { batch: Batch; due: number }

const DEFAULTS = {
  maxQueueSize: 2048, maxBatchSize: 512, scheduleDelayMs: 5000, exportTimeoutMs: 10_000, specTtlMs: 3_600_000,
  retryInitialBackoffMs: 1000, retryMaxBackoffMs: 60_000,
};

function positive(options: ReporterOptions, key: keyof typeof DEFAULTS): number {
  const value = options[key] ?? DEFAULTS[key];
  if (typeof value !== "number" || !(value > 0)) throw new VeilUsageError(`${key} must be a positive number, not ${value}.`);
  return value;
}

function perMetric<T>(setting: T | Record<string, T> | undefined, metric: string, fallback: T): T {
  if (setting === undefined) return fallback;
  if (typeof setting === "object" && setting !== null) return (setting as Record<string, T>)[metric] ?? fallback;
  return setting as T;
}

const unref = (timer: ReturnType<typeof setTimeout>) => (timer as { unref?: () => void }).unref?.();

export class Reporter {
  private readonly transport: Transport;
  private readonly settings: { [K in keyof typeof DEFAULTS]: number };
  private readonly words: WordSource;
  private readonly clock: () => number;
  private readonly log: (message: string) => void;
  private readonly logged = new Set<string>();
  private device: DeviceState | null = null;
  private metrics = new Map<string, Metric>();
  /** The parts of each numeric metric, by the name apps report the number under. */
  private numeric = new Map<string, Metric[]>();
  /** The rounds served of each strings metric, by the name apps report strings under. */
  private strings = new Map<string, Map<number, Metric>>();
  private maxBatch = 0;
  private specsVersion = "";
  private fetching = false;
  /** A fetch was asked for while one was in flight: fetch again when it ends. */
  private fetchAgain = false;
  /** The aggregator's clock as its specs answers say it: what the ledger bounds the device's clock by. */
  readonly serverClock = new ServerClock();
  /** Seconds after a slot's end the aggregator still counts its reports (0: not said). */
  maxLatenessSeconds = 0;
  private ready = false;
  private closed = false;
  private stopping = false;
  /** Calls made before the store is open and specs are known: metric, value, the time of the call. */
  private readonly held: [string, Value, number][] = [];
  /** Strings whose round of their metric this device answers is not served now (or not by an answer
   * of the strings' period): metric, code, the time of the call. */
  private readonly waiting: [string, Uint8Array, number][] = [];
  /** The specs of the last answer that this SDK does not reproduce, by name. */
  private refused = new Set<string>();
  /** Reports admitted whose spending is being stored, and the memo keys whose new response is drawn
   * once it is. */
  private admitting = 0;
  private readonly drawing = new Set<string>();
  private readonly open = new Map<string, Open>();
  private readonly batches: Batch[] = [];
  private pumping = false;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private specTimer: ReturnType<typeof setTimeout> | null = null;
  private wake: (() => void) | null = null;
  private waiters: (() => void)[] = [];
  private readonly counts: Counters = { accepted: 0, dropped: 0, sent: 0, retried: 0, failed: 0, queued: 0, limited: 0,
    overBudget: 0, tooLate: 0, ledgerUnavailable: 0, clipped: 0 };
  private lastFlush = { dropped: 0, failed: 0, tooLate: 0, ledgerUnavailable: 0 };
  private readonly onExit = () => void this.shutdown(this.settings.exportTimeoutMs);
  private readonly onHide = () => {
    if (globalThis.document?.visibilityState !== "visible") this.cut(true);
  };

  constructor(private readonly options: ReporterOptions) {
    if (options.transport === undefined && typeof options.endpoint !== "string") {
      throw new VeilUsageError("A Reporter needs an endpoint (the aggregator's HTTP address) or a transport.");
    }
    this.transport = options.transport ?? new HttpTransport({ url: options.endpoint!.replace(/\/+$/, ""),
      token: options.token });
    this.settings = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, positive(options, k as keyof typeof DEFAULTS)])
    ) as Reporter["settings"];
    this.words = options.words ?? new SystemWords();
    // Periods and made times: the device's clock, bounded by the aggregator's (clock.ts).
    this.clock = boundedClock(options.clock ?? Date.now, () => this.serverClock.nowMs());
    this.log = options.log ?? ((message) => console.warn(message));
    // A page going away sends what is batched at once (fetch keepalive outlives the page); a Node
    // process about to exit shuts the Reporter down first.
    globalThis.addEventListener?.("pagehide", this.onHide);
    globalThis.document?.addEventListener("visibilitychange", this.onHide);
    globalThis.process?.once?.("beforeExit", this.onExit);
    void this.start();
  }

  // --- what the app calls ----------------------------------------------------------------------

  /** Randomize `value` (a category label or index of `metric`, a number of a numeric metric, or a
   * string or bytes of a strings metric, reported in the one round of it this device answers) and
   * queue the report. Never waits on the network; throws only for a metric that is not a string
   * (UnknownMetricError) or a value that is neither a string, a finite number nor a Uint8Array
   * (UnknownCategoryError). A value not of the metric's kind is dropped and counted, as in the
   * Python SDK: what kind a metric is is the operator's config, which may change under a running
   * app. */
  report(metric: string, value: Value): void {
    if (typeof metric !== "string") throw new UnknownMetricError("A metric name must be a string.");
    if (typeof value !== "string" && !(value instanceof Uint8Array)
      && !(typeof value === "number" && Number.isFinite(value))) {
      throw new UnknownCategoryError("A value must be a category label or index, a finite number, or bytes.");
    }
    if (this.stopping) return this.drop("closed", "The Veil Reporter is shut down; reports are dropped.");
    if (!this.ready) {
      // Until the device's store is open and specs are known, calls wait here (true values, on the
      // device only, never sent as such).
      if (this.counts.queued >= this.settings.maxQueueSize) return this.drop("full", FULL);
      this.held.push([metric, value, this.clock()]);
      this.counts.queued += 1;
      return;
    }
    this.process(metric, value, this.clock());
  }

  /** Send everything queued now; true when all of it was acknowledged within timeoutMs and
   * nothing was dropped or failed since the previous flush (or the start). */
  async flush(timeoutMs = 30_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    await this.until(() => this.ready || this.closed, deadline);
    // Reports admitted a moment ago are batched once their spending is stored.
    await this.until(() => this.admitting === 0, deadline);
    this.cut(true);
    // Strings waiting for their round are no reports yet (as in the Python SDK): not waited for.
    const done = await this.until(() => this.counts.queued === this.waiting.length, deadline);
    const { dropped, failed, tooLate, ledgerUnavailable } = this.counts;
    const clean = dropped === this.lastFlush.dropped && failed === this.lastFlush.failed
      && tooLate === this.lastFlush.tooLate && ledgerUnavailable === this.lastFlush.ledgerUnavailable;
    this.lastFlush = { dropped, failed, tooLate, ledgerUnavailable };
    return done && clean;
  }

  /** Stop accepting reports, send what is queued for at most timeoutMs, drop (and count) the rest,
   * and close the connection. True when everything was delivered. Idempotent. */
  async shutdown(timeoutMs = 5000): Promise<boolean> {
    if (this.stopping) return this.until(() => this.closed, Date.now() + timeoutMs).then(() => this.counts.queued === 0);
    this.stopping = true;
    globalThis.removeEventListener?.("pagehide", this.onHide);
    globalThis.document?.removeEventListener("visibilitychange", this.onHide);
    globalThis.process?.removeListener?.("beforeExit", this.onExit);
    const delivered = await this.flush(timeoutMs);
    this.closed = true;
    for (const timer of [this.timer, this.specTimer]) if (timer) clearTimeout(timer);
    const left = this.counts.queued;
    this.counts.dropped += left;
    this.counts.queued = 0;
    this.held.length = 0;
    this.waiting.length = 0;
    this.batches.length = 0;
    this.open.clear();
    this.wake?.();
    this.transport.close();
    if (left > 0) this.log(`Veil: shut down with ${left} reports unsent (dropped); sent ${this.counts.sent}, ` +
      `dropped ${this.counts.dropped}, failed ${this.counts.failed}.`);
    this.notify();
    return delivered && left === 0;
  }

  counters(): Counters {
    return { ...this.counts };
  }

  /** Whether the first specs arrived within timeoutMs (until then report() holds its calls). */
  whenReady(timeoutMs = 10_000): Promise<boolean> {
    return this.until(() => this.ready, Date.now() + timeoutMs);
  }

  /** What this device has spent on `metric` (a strings metric: on the round it answers; undefined:
   * no spec for it yet). */
  privacySpent(metric: string): PrivacySpent | undefined {
    const m = this.metrics.get(metric) ?? (this.device ? this.strings.get(metric)?.get(this.device.memo.round(metric))
      : undefined);
    if (!m || !this.device) return undefined;
    return this.device.ledger.spent(m, this.period(m, this.clock()), ...this.budgets(m), m.design.epsilon);
  }

  // --- report() once ready ---------------------------------------------------------------------

  /** report() of a call made at `now` (Unix ms): a category of its metric, a number reported as
   * a category of each part of its numeric metric, or a string of a strings metric. */
  private process(name: string, value: Value, now: number): void {
    const unknown = () => this.drop(`unknown-category:${name}`,
      `Veil: a value the metric ${JSON.stringify(name)} does not declare was dropped.`);
    const metric = this.metrics.get(name);
    const device = this.device!;
    if (metric === undefined) {
      const rounds = this.strings.get(name);
      if (rounds !== undefined) {
        if (typeof value === "number") return unknown();  // a number or index held before the specs said
        // The value itself is kept no longer: a code's code is the code.
        return this.reportString(name, rounds, stringCode(value), now);
      }
      const parts = this.numeric.get(name);
      if (parts === undefined) {
        if (this.refused.has(name)) return this.drop(`refused:${name}`, refusedMessage(name));
        return this.drop(`unknown-metric:${name}`, `Veil: no spec for the metric ${JSON.stringify(name)}; its reports are dropped.`);
      }
      if (typeof value !== "number") return unknown();  // held before the specs said it is numeric
      let clipped = false;
      for (const part of parts) {
        const numeric = part.numeric!;
        const [x, moved] = clip(numeric, value);
        clipped ||= moved;
        const alpha = numeric.part === "mean" ? device.memo.alpha(part.name, part.fingerprint) : 0;
        this.category(part, numericCategory(numeric, x, alpha), now);
      }
      if (clipped) this.counts.clipped += 1;
      return;
    }
    if (metric.numeric) {
      return this.drop(`part:${name}`, `Veil: ${JSON.stringify(name)} is a part of the numeric metric ` +
        `${JSON.stringify(metric.numeric.metric)}; report the number under that name. Dropped.`);
    }
    if (metric.strings) {
      return this.drop(`round:${name}`, `Veil: ${JSON.stringify(name)} is a round of the strings metric ` +
        `${JSON.stringify(metric.strings.metric)}; report the string under that name. Dropped.`);
    }
    if (value instanceof Uint8Array) return unknown();  // bytes are a strings metric's
    const index = typeof value === "string" ? metric.labels.indexOf(value) : value;
    if (!Number.isInteger(index) || index < 0 || index >= metric.labels.length) return unknown();
    this.category(metric, index, now);
  }

  /** The category `index` of `metric`, called at `now`. */
  private category(metric: Metric, index: number, now: number): void {
    const device = this.device!;
    this.admit(metric, now, () => device.memo.key(metric.name, metric.fingerprint, index),
      () => randomize(metric.design, index, this.words));
  }

  /** The code of a string of the strings metric `name`, called at `now`: the prefix of its code,
   * under the spec of the round this device answers. A round changes every period and counts only
   * the values made in its own (a batch made in another is refused as stale): while that round is
   * not served, or the specs held were not the aggregator's in the value's period (an answer of
   * this run said so), the code waits, as made, for an answer that is; once the value's period is
   * over it is dropped and counted. */
  private reportString(name: string, rounds: Map<number, Metric>, code: Uint8Array, now: number): void {
    const device = this.device!;
    const answers = device.memo.round(name);
    const round = rounds.get(answers);
    if (round === undefined && this.refused.has(roundName(name, answers))) {
      return this.drop(`refused:${name}`, refusedMessage(name));
    }
    const rule = round ?? rounds.values().next().value!;  // every round has the metric's period
    const period = this.period(rule, now);
    if (period < this.period(rule, this.clock())) {
      return this.drop(`strings-expired:${name}`, `Veil: a string of the metric ${JSON.stringify(name)} waited for ` +
        "its round until its period was over; dropped.");
    }
    const answered = this.serverClock.answeredMs();
    if (round === undefined || answered === null || this.period(rule, answered) < period) {
      if (this.counts.queued >= this.settings.maxQueueSize) return this.drop("full", FULL);
      this.waiting.push([name, code, now]);
      this.counts.queued += 1;
      return;
    }
    const prefix = code.subarray(0, prefixBytes(round.strings!));
    this.admit(round, now, () => device.memo.stringsKey(round.name, round.memoDesign!, prefix),
      () => randomizeHashed(round.design, prefix, this.words));
  }

  /** A report of `metric` called at `now`: its period, ledger, memo (its key from memoKey) and
   * batch; draw randomizes a new response. */
  private admit(metric: Metric, now: number, memoKey: () => string, draw: () => number[]): void {
    const device = this.device!;
    const name = metric.name;
    try {
      const period = this.period(metric, now);
      if (device.ledger.full(metric, period)) return void (this.counts.limited += 1);
      if (this.counts.queued >= this.settings.maxQueueSize) return this.drop("full", FULL);
      const memoizes = perMetric(this.options.memoize, name, perMetric(this.options.memoize, owner(metric), true));
      const key = memoizes ? memoKey() : null;
      // A response drawn for an admission whose spending is being stored is this key's response too.
      const fresh = key === null || !(device.memo.known(key) || this.drawing.has(key));
      const refused: Refusal | null = device.ledger.admit(metric, period, fresh ? metric.design.epsilon : 0,
        ...this.budgets(metric));
      if (refused === "behind") {
        this.warnOnce("behind", "Veil: the device's clock is behind a reporting period already reported in; " +
          "reports of earlier periods are not sent.");
      }
      if (refused === "period" || refused === "behind") return void (this.counts.limited += 1);
      const stored = device.ledgerStored();  // the period's slot a refusal takes is stored too
      if (refused === "budget") return void (this.counts.overBudget += 1);
      // Randomized and queued once the spending is stored: a response is never drawn (and memoized)
      // for a report the ledger could not record.
      this.counts.queued += 1;
      this.admitting += 1;
      if (key !== null && fresh) this.drawing.add(key);
      void stored.then((admitted) => {
        // The admissions that counted on this draw were made before this answer: they share its fate.
        if (key !== null && fresh) this.drawing.delete(key);
        this.admitting -= 1;
        if (this.closed) return;  // shutdown counted it as dropped
        this.counts.queued -= 1;
        if (admitted) {
          const memoized = key !== null && device.memo.known(key);
          const report = key === null ? draw() : device.memo.response(key, draw);
          if (key !== null && !memoized) device.changed("memo");
          this.enqueue(metric, report, now);
        } else {
          this.counts.ledgerUnavailable += 1;
        }
        this.notify();
      }).catch(() => this.drop("error", "Veil: a report could not be randomized and was dropped."));
    } catch {
      this.drop("error", "Veil: a report could not be randomized and was dropped.");
    }
  }

  private period(metric: Metric, now: number): number {
    return Math.floor(now / 1000 / metric.periodSeconds);
  }

  /** The metric's (period, lifetime) budgets: the aggregator's, or this app's where lower; a period
   * budget of null: neither set one, and the period's reports are its only bound. */
  private budgets(metric: Metric): [number | null, number] {
    // A strings metric's name covers its rounds (the lower wins), as in the Python SDK.
    const own = (setting: number | Record<string, number> | undefined) => Math.min(perMetric(setting, metric.name,
      Infinity), metric.strings ? perMetric(setting, metric.strings.metric, Infinity) : Infinity);
    const period = Math.min(metric.periodBudget ?? Infinity, own(this.options.periodBudget));
    return [period === Infinity ? null : period, Math.min(metric.lifetimeBudget, own(this.options.lifetimeBudget))];
  }

  private enqueue(metric: Metric, report: number[], now: number): void {
    const resolution = metric.timeResolutionSeconds;
    const madeUnix = Math.floor(now / 1000 / resolution) * resolution;
    const key = `${metric.name}\u0000${metric.fingerprint}\u0000${madeUnix}`;
    let open = this.open.get(key);
    if (!open) {
      open = { batch: { metric, reports: [], id: new Uint8Array(0), made: 0, madeUnix },
        due: Date.now() + this.settings.scheduleDelayMs };
      this.open.set(key, open);
      this.schedule();
    }
    open.batch.reports.push(report);
    this.counts.accepted += 1;
    this.counts.queued += 1;
    const limit = Math.min(this.settings.maxBatchSize, this.maxBatch || Infinity);
    if (open.batch.reports.length >= limit) this.cut(false, key);
  }

  private drop(key: string, message: string): void {
    this.counts.dropped += 1;
    this.warnOnce(key, message);
  }

  private warnOnce(key: string, message: string): void {
    if (this.logged.has(key)) return;
    this.logged.add(key);
    this.log(message);
  }

  // --- batches and uploads ---------------------------------------------------------------------

  /** Close the open batches that are due (all, or the one of `only`) and start uploading them. */
  private cut(all: boolean, only?: string): void {
    const now = Date.now();
    for (const [key, open] of this.open) {
      if (only !== undefined ? key !== only : !all && open.due > now) continue;
      this.open.delete(key);
      open.batch.id = globalThis.crypto.getRandomValues(new Uint8Array(16));
      open.batch.made = this.clock();
      this.batches.push(open.batch);
    }
    this.schedule();
    void this.pump();
  }

  private schedule(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.open.size === 0 || this.closed) return;
    const due = Math.min(...[...this.open.values()].map((o) => o.due));
    this.timer = setTimeout(() => this.cut(false), Math.max(0, due - Date.now()));
    unref(this.timer);
  }

  private async pump(): Promise<void> {
    if (this.pumping) return;
    this.pumping = true;
    try {
      let failures = 0;
      while (this.batches.length > 0 && !this.closed) {
        const call = this.nextCall();
        // The spending and responses these reports used are stored before they leave the device.
        if (!(await this.device!.persisted())) {
          for (const batch of call) this.settle(batch, "dropped");
          continue;
        }
        const timeoutMs = this.settings.exportTimeoutMs;
        // One batch goes in an Upload, which every revision answers alike.
        const sent = call.length > 1 ? await this.transport.uploadBatches(call, timeoutMs)
          : await this.transport.upload(call[0], timeoutMs);
        if (this.closed) break;
        if (sent === null) {
          this.warnOnce("revision", "Veil: the aggregator predates UploadBatches; uploading one batch per call.");
          continue;
        }
        if (sent.specsVersion && sent.specsVersion !== this.specsVersion) void this.refreshSpecs();
        let hintMs = 0;
        let retry: { why: string; token: boolean } | null = null;
        for (const [i, batch] of call.entries()) {
          const outcome = sent.outcomes[i];
          const n = batch.reports.length;
          if (outcome.kind === "ok") {
            this.settle(batch, "sent");
          } else if (outcome.kind === "fail") {
            this.warnOnce(`fail:${outcome.why}`, `Veil: the aggregator refused a batch of ${n} reports for good (${outcome.why}).`);
            this.settle(batch, outcome.tooLate ? "tooLate" : "failed");
            if (outcome.refetch) void this.refreshSpecs();
          } else if (this.clock() - batch.made > RETRY_HORIZON_MS) {
            this.settle(batch, "failed");
          } else {
            this.counts.retried += 1;
            retry ??= outcome;
            hintMs = Math.max(hintMs, outcome.hintMs);
          }
        }
        if (retry === null) {
          failures = 0;
          this.logged.delete("upload");
          continue;
        }
        const { why, token } = retry;
        this.warnOnce("upload", token
          ? "Veil: the aggregator refused the Veil token; batches stay queued and are retried."
          : `Veil: uploads are failing (${why}); batches stay queued and are retried with backoff.`);
        await this.sleep(backoffMs(failures++, this.settings.retryInitialBackoffMs, this.settings.retryMaxBackoffMs,
          hintMs));
      }
    } catch {
      this.warnOnce("pump", "Veil: the uploader stopped on an unexpected error; it restarts with the next batch.");
    } finally {
      this.pumping = false;
    }
  }

  /** The oldest batches, as many as one call takes: 64 and the aggregator's max_batch reports (one
   * batch to a revision-1 aggregator: its specs say no version, or it answered UploadBatches as
   * unknown; with tokens it would refuse UploadBatches as forbidden, not unknown). */
  private nextCall(): Batch[] {
    const most = this.transport.batches && this.specsVersion ? BATCHES_PER_CALL : 1;
    const limit = this.maxBatch || this.settings.maxBatchSize;
    const call: Batch[] = [];
    let reports = 0;
    for (const batch of this.batches) {
      if (call.length === most || (call.length > 0 && reports + batch.reports.length > limit)) break;
      call.push(batch);
      reports += batch.reports.length;
    }
    return call;
  }

  private settle(batch: Batch, how: "sent" | "failed" | "dropped" | "tooLate"): void {
    this.batches.splice(this.batches.indexOf(batch), 1);
    this.counts[how] += batch.reports.length;
    this.counts.queued -= batch.reports.length;
    this.notify();
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      unref(timer);
      const self = this;
      function done() {
        clearTimeout(timer);
        if (self.wake === done) self.wake = null;
        resolve();
      }
      this.wake = done;
    });
  }

  // --- waiting ---------------------------------------------------------------------------------

  private notify(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  /** Wait until `condition` holds (re-checked at each change) or the deadline passes. */
  private async until(condition: () => boolean, deadline: number): Promise<boolean> {
    while (!condition()) {
      const left = deadline - Date.now();
      if (left <= 0) return false;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    return true;
  }

  // --- start and specs -------------------------------------------------------------------------

  private async start(): Promise<void> {
    let store: DeviceStore;
    try {
      store = await (this.options.store ?? new MemoryStore());
    } catch {
      this.warnOnce("store:open", "Veil: the device store cannot be opened; the memo and the ledger live in memory.");
      store = new MemoryStore();
    }
    this.device = await DeviceState.open(store, (key, message) => this.warnOnce(key, message));
    try {
      if (this.device.specs !== null) this.useSpecs(JSON.parse(this.device.specs), false);
    } catch {
      // an unreadable copy of the specs: wait for fresh ones
    }
    await this.refreshSpecs();
  }

  private async refreshSpecs(failures = 0): Promise<void> {
    if (this.closed) return;
    if (this.fetching) {
      this.fetchAgain = true;
      return;
    }
    if (this.specTimer) clearTimeout(this.specTimer);
    this.fetching = true;
    this.fetchAgain = false;
    let next = this.settings.specTtlMs;
    try {
      // With the version held: "unchanged" when it is still the aggregator's (a cheap check).
      this.useSpecs(await this.transport.specs(this.settings.exportTimeoutMs, this.specsVersion), true);
      this.logged.delete("specs");
    } catch {
      this.warnOnce("specs", "Veil: the specs cannot be fetched now; retrying with backoff.");
      next = backoffMs(failures, this.settings.retryInitialBackoffMs, this.settings.retryMaxBackoffMs);
      failures += 1;
    } finally {
      this.fetching = false;
    }
    if (this.closed) return;
    if (this.fetchAgain && next === this.settings.specTtlMs) return this.refreshSpecs();
    this.specTimer = setTimeout(() => void this.refreshSpecs(next === this.settings.specTtlMs ? 0 : failures), next);
    unref(this.specTimer);
  }

  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  private useSpecs(answer: any, fetched: boolean): void {
    if (fetched) this.serverClock.heard(answer.serverTimeUnix);
    this.maxLatenessSeconds = Number(answer.maxLatenessSeconds) || this.maxLatenessSeconds;
    if (answer.unchanged === true && this.ready) return this.release();  // the specs held, confirmed now
    const { metrics, maxBatch, refused } = parseSpecs(answer);
    this.metrics = new Map(metrics.map((m) => [m.name, m]));
    this.refused = new Set(refused);
    this.numeric = new Map();
    this.strings = new Map();
    for (const m of metrics) {
      if (m.numeric) this.numeric.set(m.numeric.metric, [...this.numeric.get(m.numeric.metric) ?? [], m]);
      if (m.strings) {
        const rounds = this.strings.get(m.strings.metric) ?? new Map<number, Metric>();
        this.strings.set(m.strings.metric, rounds.set(m.strings.round, m));
      }
    }
    this.maxBatch = maxBatch;
    this.specsVersion = typeof answer.specsVersion === "string" ? answer.specsVersion : "";
    if (fetched && this.device) {
      this.device.specs = JSON.stringify(answer);  // a copy for the next start
      this.device.changed("specs");
    }
    this.release();
    if (!this.ready) {
      this.ready = true;
      const held = this.held.splice(0);
      this.counts.queued -= held.length;
      for (const [metric, value, made] of held) this.process(metric, value, made);
      this.notify();
    }
  }

  /** After a specs answer: the strings waiting for their round, as made (those whose round is still
   * not served wait again). */
  private release(): void {
    const waiting = this.waiting.splice(0);
    this.counts.queued -= waiting.length;
    for (const [metric, code, made] of waiting) this.process(metric, code, made);
    if (waiting.length > 0) this.notify();
  }
}

/** What report() takes: a category label or index, a number, or a string's bytes. */
type Value = string | number | Uint8Array;

const refusedMessage = (name: string) => `Veil: the aggregator's spec of ${JSON.stringify(name)} does not match ` +
  "its fingerprint here (a newer wire revision?); its reports are dropped.";

/** The name an app reports a metric's values under: a numeric part's or a strings round's metric. */
function owner(metric: Metric): string {
  return metric.numeric?.metric ?? metric.strings?.metric ?? metric.name;
}

const FULL = "Veil: the report queue is full; new reports are dropped until uploads catch up.";
