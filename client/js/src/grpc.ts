// The Collector service over gRPC for Node (@grpc/grpc-js), with the wire contract's own proto
// (proto/veil/wire/v1/veil.proto, copied into dist/proto by the build). Uploads travel as the
// bytes encode.ts writes, so every attempt of a batch is the same bytes. Several batches go in one
// UploadBatches call; an aggregator older than revision 2 answers it UNIMPLEMENTED, and this
// transport then sends one Upload per batch for as long as it lives.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

import type * as Grpc from "@grpc/grpc-js";
import type * as ProtoLoader from "@grpc/proto-loader";

import { encodeUpload, encodeUploads } from "./encode.js";
import {
  Code, hintOf, outcomeOfCode, type Batch, type Outcome, type Sent, type SpecsAnswer, type Transport,
} from "./transport.js";

const PROTO = fileURLToPath(new URL("../proto/veil.proto", import.meta.url));

// Optional peer dependencies, loaded when first used (the first GrpcTransport), not at import:
// an app that reports over HTTP, or takes only nodeFileStore from "@veil/client/node", installs
// neither. Both are CommonJS, so require() loads them synchronously.
const load = createRequire(import.meta.url);
function optional<T extends object>(name: string): T {
  let loaded: T | undefined;
  return new Proxy({} as T, {
    get(_, key) {
      try {
        loaded ??= load(name) as T;
      } catch (error) {
        throw new Error(`GrpcTransport needs ${name}: npm install @grpc/grpc-js @grpc/proto-loader`, { cause: error });
      }
      return Reflect.get(loaded, key);
    },
  });
}
const grpc = optional<typeof Grpc>("@grpc/grpc-js");
const protoLoader = optional<typeof ProtoLoader>("@grpc/proto-loader");
const UPLOAD = "/veil.wire.v1.Collector/Upload";
const UPLOAD_BATCHES = "/veil.wire.v1.Collector/UploadBatches";

const bytesOf = (b: Batch) =>
  encodeUpload(b.metric.design, b.metric.name, b.metric.fingerprint, b.reports, b.id, b.madeUnix);

export interface GrpcOptions {
  token?: string;
  /** TLS with the system roots (default true, but false to a loopback address given no caFile or
   * clientCert); caFile, and clientCert with clientKey for mutual TLS. */
  tls?: boolean;
  caFile?: string;
  clientCert?: string;
  clientKey?: string;
}

/** What a failed call means for its batches (transport.ts: outcomeOfCode). */
function outcomeOfError(error: Grpc.ServiceError): Outcome {
  const hint = error.metadata?.get("retry-after-ms")[0];
  return outcomeOfCode(error.code, grpc.status[error.code] ?? String(error.code),
    hintOf(hint === undefined ? null : String(hint)));
}

// As the Python SDK: TLS unless the address is this machine and nothing asks for TLS (the local
// demo serves plaintext on loopback, where TLS fails with nothing but an SSL error).
function isLoopback(address: string): boolean {
  const host = address.slice(0, Math.max(address.lastIndexOf(":"), 0)).replace(/^\[|\]$/g, "") || address;
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

function credentials(address: string, options: GrpcOptions): Grpc.ChannelCredentials {
  const tls = options.tls ?? !(isLoopback(address) && !options.caFile && !options.clientCert);
  if (!tls) return grpc.credentials.createInsecure();
  const read = (path?: string) => (path ? readFileSync(path) : null);
  return grpc.credentials.createSsl(read(options.caFile), read(options.clientKey), read(options.clientCert));
}

export class GrpcTransport implements Transport {
  readonly kind = "grpc";
  batches = true;
  private readonly client: Grpc.Client;
  private readonly service: Grpc.ServiceDefinition;

  /** address: "host:port" of the aggregator's gRPC listener. */
  constructor(address: string, private readonly options: GrpcOptions = {}) {
    const loaded = grpc.loadPackageDefinition(protoLoader.loadSync(PROTO, {
      // bytes as base64 (a strings round's parents), as the HTTP answer's proto3 JSON has them.
      keepCase: false, longs: Number, enums: String, bytes: String, defaults: false, oneofs: true,
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    })) as any;
    const Collector = loaded.veil.wire.v1.Collector as Grpc.ServiceClientConstructor;
    this.service = Collector.service;
    this.client = new Collector(address, credentials(address, options));
  }

  private metadata(): Grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.options.token) metadata.set("authorization", `Bearer ${this.options.token}`);
    return metadata;
  }

  specs(timeoutMs: number, ifVersion = ""): Promise<SpecsAnswer> {
    const method = this.service.GetMetricSpecs;
    return new Promise((resolve, reject) => {
      this.client.makeUnaryRequest(method.path, method.requestSerialize, method.responseDeserialize,
        ifVersion ? { ifVersion } : {}, this.metadata(), { deadline: Date.now() + timeoutMs },
        (error, answer) => (error ? reject(error) : resolve(answer as SpecsAnswer)));
    });
  }

  private call<T>(path: string, bytes: Uint8Array, answer: (b: Buffer) => unknown, timeoutMs: number
  ): Promise<{ error: Grpc.ServiceError | null; reply: T }> {
    return new Promise((resolve) => {
      this.client.makeUnaryRequest(path, (b: Buffer) => b, answer, Buffer.from(bytes), this.metadata(),
        { deadline: Date.now() + timeoutMs }, (error, reply) => resolve({ error, reply: reply as T }));
    });
  }

  async upload(batch: Batch, timeoutMs: number): Promise<Sent> {
    const { error, reply } = await this.call<{ accepted?: number; duplicate?: boolean; specsVersion?: string }>(
      UPLOAD, bytesOf(batch), this.service.Upload.responseDeserialize, timeoutMs);
    if (error) return { outcomes: [outcomeOfError(error)], specsVersion: "" };
    return { outcomes: [{ kind: "ok", accepted: reply.accepted ?? 0, duplicate: reply.duplicate ?? false }],
      specsVersion: reply.specsVersion ?? "" };
  }

  async uploadBatches(batches: Batch[], timeoutMs: number): Promise<Sent | null> {
    const { error, reply } = await this.call<{ results?: { code?: number; message?: string; accepted?: number;
      duplicate?: boolean }[]; specsVersion?: string }>(UPLOAD_BATCHES, encodeUploads(batches.map(bytesOf)),
      this.service.UploadBatches.responseDeserialize, timeoutMs);
    if (error?.code === Code.UNIMPLEMENTED) {
      this.batches = false;
      return null;
    }
    if (error) return { outcomes: batches.map(() => outcomeOfError(error)), specsVersion: "" };
    const results = reply.results ?? [];
    if (results.length !== batches.length) {
      return { outcomes: batches.map(() => ({ kind: "retry", why: "a result per batch", hintMs: 0, token: false })),
        specsVersion: "" };
    }
    return { specsVersion: reply.specsVersion ?? "", outcomes: results.map((r) => r.code
      ? outcomeOfCode(r.code, r.message || grpc.status[r.code] || `code ${r.code}`)
      : { kind: "ok", accepted: r.accepted ?? 0, duplicate: r.duplicate ?? false }) };
  }

  close(): void {
    this.client.close();
  }
}
