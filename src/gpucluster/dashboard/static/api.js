// The dashboard's only way to the head: the public HTTP API (/v1/...), with the user's bearer
// token. The token lives in localStorage; it arrives from the sign-in form or from the URL
// fragment (`/#token=...`, which `gpucluster up` can print), and is stripped from the address bar
// at once so it does not linger in history or screenshots.

const TOKEN_KEY = "gpucluster.token";
let memoryToken = ""; // used when localStorage is unavailable

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let onUnauthorized = () => {};

/** Called with the head's message whenever a call answers 401 (no, bad or expired token). */
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

export function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return memoryToken; // no storage (some private modes): the token lasts as long as the page
  }
}

export function setToken(token) {
  memoryToken = token || "";
  try {
    if (token) localStorage.setItem(TOKEN_KEY, token);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    // kept in memoryToken only
  }
}

function authHeaders() {
  const token = getToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** Take `token=...` out of the fragment, keep it, and leave the rest of the route in place. */
export function adoptTokenFromFragment() {
  const hash = window.location.hash.replace(/^#/, "");
  if (!hash.includes("token=")) return false;
  const [route, query] = hash.includes("?") ? hash.split("?", 2) : hash.startsWith("/") ? [hash, ""] : ["", hash];
  const params = new URLSearchParams(query);
  const token = params.get("token");
  if (!token) return false;
  params.delete("token");
  setToken(token.trim());
  const rest = params.toString();
  const newHash = `#${route || "/"}${rest ? `?${rest}` : ""}`;
  history.replaceState(null, "", window.location.pathname + window.location.search + newHash);
  return true;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && typeof body.error === "string") return body.error;
    if (body && typeof body.detail === "string") return body.detail;
  } catch {
    // not JSON
  }
  return `${response.status} ${response.statusText}`.trim();
}

/** Ask the head whether it takes `token` (GET /v1/whoami with it), before the dashboard keeps it:
 * one request, so a refused token is one 401, not one per panel of the page that would poll with
 * it. Throws ApiError (401: refused; 0: the head cannot be reached); the 401 handler is not called. */
export async function checkToken(token) {
  let response;
  try {
    response = await fetch("/v1/whoami", {
      headers: { Accept: "application/json", Authorization: `Bearer ${token}` },
      cache: "no-store",
    });
  } catch {
    throw new ApiError(0, "cannot reach the head; is `gpucluster up` running?");
  }
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
}

/** Fetch `path` from the head; JSON bodies are parsed, anything else returned as text. */
export async function api(path, { method = "GET", body, signal, raw = false } = {}) {
  const headers = { Accept: "application/json", ...authHeaders() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "cannot reach the head; is `gpucluster up` running?");
  }
  if (response.status === 401) {
    const message = await errorMessage(response);
    onUnauthorized(message);
    throw new ApiError(401, message);
  }
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  if (raw) return response;
  const type = response.headers.get("content-type") || "";
  if (response.status === 204) return null;
  return type.includes("json") ? response.json() : response.text();
}

let openapiPaths = null;

/** Whether the head offers an endpoint (read from its OpenAPI document, once per page load), so
 * optional panels ask only for what exists instead of provoking 404s. */
export async function hasEndpoint(path) {
  return (await endpoints()).has(path);
}

/** Every GET path the head documents (empty when its OpenAPI document cannot be read now). */
export async function endpoints() {
  if (openapiPaths === null) {
    try {
      const doc = await api("/openapi.json");
      openapiPaths = new Set(Object.keys(doc.paths || {}).filter((p) => doc.paths[p].get));
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) throw e;
      return new Set(); // try again on the next refresh
    }
  }
  return openapiPaths;
}
