// The device store in browsers: IndexedDB (database "veil", object store "device"), else
// localStorage (keys "veil.<name>"), else memory, each with a log line saying so. The tabs of one
// origin share it; each keeps its own view while it runs, so two tabs reporting the same metric
// at once may each draw a response.

import { MemoryStore, type DeviceStore } from "./store.js";

const DATABASE = "veil";
const TABLE = "device";

function request<T>(r: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

async function indexedDbStore(): Promise<DeviceStore> {
  const opening = indexedDB.open(DATABASE, 1);
  opening.onupgradeneeded = () => opening.result.createObjectStore(TABLE);
  const db = await request(opening);
  return {
    kind: "IndexedDB",
    async read(name) {
      const found = await request(db.transaction(TABLE, "readonly").objectStore(TABLE).get(name));
      return typeof found === "string" ? found : null;
    },
    write(name, text) {
      return new Promise((resolve, reject) => {
        // "strict": the write is on disk when the transaction completes.
        const tx = db.transaction(TABLE, "readwrite", { durability: "strict" });
        tx.objectStore(TABLE).put(text, name);
        tx.oncomplete = () => resolve();
        tx.onerror = tx.onabort = () => reject(tx.error);
      });
    },
  };
}

function localStorageStore(): DeviceStore {
  const storage = globalThis.localStorage;
  storage.setItem("veil.probe", "1");  // throws where storage is refused (e.g. some private modes)
  storage.removeItem("veil.probe");
  return {
    kind: "localStorage",
    read: async (name) => storage.getItem(`veil.${name}`),
    write: async (name, text) => storage.setItem(`veil.${name}`, text),
  };
}

/** IndexedDB where the browser allows it, else localStorage, else memory. */
export async function browserStore(warn: (message: string) => void = console.warn): Promise<DeviceStore> {
  try {
    return await indexedDbStore();
  } catch {
    try {
      const store = localStorageStore();
      warn("Veil: IndexedDB cannot be used; the device's memo and ledger are kept in localStorage.");
      return store;
    } catch {
      warn("Veil: neither IndexedDB nor localStorage can be used; the memo and ledger live in memory.");
      return new MemoryStore();
    }
  }
}
