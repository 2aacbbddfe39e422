// The viewer's API as the page's modules call it: every request carries the access
// token (X-Flyarchive-Token), this page's own id (X-Flyarchive-Client: renders are queued
// fairly between pages) and, once known, the archive_id the page shows
// (X-Flyarchive-Archive: an archive opened again since is answered 409, never mixed in).
// A refusal becomes an ApiError holding the server's one-line message.
//
// A new panel (a plot, a diagram) imports what it needs from here:
//   import { api, getJson } from "/static/api.js";
//   const answer = await getJson(`/api/table?${new URLSearchParams({ where: "success == 1" })}`);

const token = new URLSearchParams(location.search).get("token") || sessionStorage.getItem("flyarchive-token") || "";
sessionStorage.setItem("flyarchive-token", token);
history.replaceState(null, "", location.pathname);  // the token leaves the address bar

// random hex, also where crypto.randomUUID is missing (a page served to another machine
// over plain HTTP is not a secure context)
const client = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
let archiveId = null;

export class ApiError extends Error {
  // status: the HTTP status (0: no answer); replaced: the archive was replaced (409);
  // retryAfter: seconds to wait (429)
  constructor(message, { status = 0, replaced = false, retryAfter = 0 } = {}) {
    super(message);
    this.status = status; this.replaced = replaced; this.retryAfter = retryAfter;
  }
}

// The archive_id every later request says the page shows (from /api/info).
export function showing(id) { archiveId = id; }

export async function api(path, options = {}) {
  const headers = { "X-Flyarchive-Token": token, "X-Flyarchive-Client": client, ...(options.headers || {}) };
  if (archiveId !== null) headers["X-Flyarchive-Archive"] = archiveId;
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch (err) {
    throw new ApiError(`The viewer did not answer (${err.message}); is \`flyarchive view\` still running?`);
  }
  if (!response.ok) {
    let text = `${response.status} ${response.statusText}`;
    let replaced = false;
    try { const j = await response.json(); text = j.error || text; replaced = !!j.replaced; } catch (e) { /* not JSON */ }
    throw new ApiError(text, { status: response.status, replaced, retryAfter: Number(response.headers.get("Retry-After")) || 0 });
  }
  return response;
}

export const getJson = async (path) => (await api(path)).json();

// How long the server worked on a response (its Server-Timing header), ms.
export function serverTime(response) {
  const timing = /dur=([0-9.]+)/.exec(response.headers.get("Server-Timing") || "");
  return timing ? Number(timing[1]) : 0;
}
