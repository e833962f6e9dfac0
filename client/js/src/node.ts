// Node's side of the SDK, imported from "@veil/client/node" (browsers never load it): the device
// store as files in a directory, and gRPC.
//
// nodeFileStore(directory): each name is a file there, the directory owner-only (0700), the files
// too (0600); a write goes to a temporary file, is synced, and renamed over the old one, so a
// crash leaves the old or the new text, never a torn one. One Reporter per directory at a time.

import { chmod, mkdir, open, readFile, rename } from "node:fs/promises";
import { join } from "node:path";

import type { DeviceStore } from "./store.js";

export { GrpcTransport, type GrpcOptions } from "./grpc.js";

export function nodeFileStore(directory: string): DeviceStore {
  let made: Promise<void> | null = null;
  const ready = () => (made ??= mkdir(directory, { recursive: true, mode: 0o700 }).then(() => chmod(directory, 0o700)));
  return {
    kind: directory,
    async read(name) {
      try {
        return await readFile(join(directory, name), "utf8");
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
        throw error;
      }
    },
    async write(name, text) {
      await ready();
      const path = join(directory, name);
      const file = await open(`${path}.tmp`, "w", 0o600);
      try {
        await file.writeFile(text);
        await file.sync();
      } finally {
        await file.close();
      }
      await rename(`${path}.tmp`, path);
    },
  };
}
