// The Collector service over gRPC for Node (@grpc/grpc-js), with the wire contract's own proto
// (proto/veil/wire/v1/veil.proto, copied into dist/proto by the build). Uploads travel as the
// bytes encode.ts writes, so every attempt of a batch is the same bytes.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

import type * as Grpc from "@grpc/grpc-js";
import type * as ProtoLoader from "@grpc/proto-loader";

import { encodeUpload } from "./encode.js";
import { hintOf, type Batch, type Outcome, type SpecsAnswer, type Transport } from "./transport.js";

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

export interface GrpcOptions {
  token?: string;
  /** TLS with the system roots (default true, but false to a loopback address given no caFile or
   * clientCert); caFile, and clientCert with clientKey for mutual TLS. */
  tls?: boolean;
  caFile?: string;
  clientCert?: string;
  clientKey?: string;
}

// Final refusals (docs/protocol.md, section 5); every other status is retried. (Functions, so
// that importing this module does not load grpc-js.)
const FINAL = () => new Set([grpc.status.INVALID_ARGUMENT, grpc.status.OUT_OF_RANGE]);
const TOKEN = () => new Set([grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED]);

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
  private readonly client: Grpc.Client;
  private readonly service: Grpc.ServiceDefinition;

  /** address: "host:port" of the aggregator's gRPC listener. */
  constructor(address: string, private readonly options: GrpcOptions = {}) {
    const loaded = grpc.loadPackageDefinition(protoLoader.loadSync(PROTO, {
      keepCase: false, longs: Number, enums: String, defaults: false, oneofs: true,
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

  specs(timeoutMs: number): Promise<SpecsAnswer> {
    const method = this.service.GetMetricSpecs;
    return new Promise((resolve, reject) => {
      this.client.makeUnaryRequest(method.path, method.requestSerialize, method.responseDeserialize, {},
        this.metadata(), { deadline: Date.now() + timeoutMs },
        (error, answer) => (error ? reject(error) : resolve(answer as SpecsAnswer)));
    });
  }

  upload(batch: Batch, timeoutMs: number): Promise<Outcome> {
    const { metric, reports, id } = batch;
    const bytes = Buffer.from(encodeUpload(metric.design, metric.name, metric.fingerprint, reports, id));
    const answer = this.service.Upload.responseDeserialize;
    return new Promise((resolve) => {
      this.client.makeUnaryRequest(UPLOAD, (b: Buffer) => b, answer, bytes, this.metadata(),
        { deadline: Date.now() + timeoutMs }, (error, reply) => {
          if (!error) {
            const r = reply as { accepted?: number; duplicate?: boolean };
            resolve({ kind: "ok", accepted: r.accepted ?? 0, duplicate: r.duplicate ?? false });
          } else if (FINAL().has(error.code)) {
            resolve({ kind: "fail", why: grpc.status[error.code], refetch: false });
          } else if (error.code === grpc.status.FAILED_PRECONDITION) {
            resolve({ kind: "fail", why: "stale spec (FAILED_PRECONDITION)", refetch: true });
          } else {
            const hint = error.metadata?.get("retry-after-ms")[0];
            resolve({ kind: "retry", why: grpc.status[error.code] ?? String(error.code),
              hintMs: hintOf(hint === undefined ? null : String(hint)), token: TOKEN().has(error.code) });
          }
        });
    });
  }

  close(): void {
    this.client.close();
  }
}
