// The only way the pages talk to routerd: fetch() against the node that served the page, with the
// admin key (if one was given) as a bearer token.  The key lives in sessionStorage only: never in
// the URL, gone when the tab closes.  A 401 clears it and brings the sign-in dialog back; the call
// is retried once the operator has entered a key.

const KEY = "routerd.adminKey";

export class ApiError extends Error {
  constructor(status, type, code, message) {
    super(message);
    this.status = status;
    this.type = type;
    this.code = code;
  }
}

let waiting = null; // the pending sign-in (one dialog however many calls got a 401)

export function storedKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function signOut() {
  sessionStorage.removeItem(KEY);
}

function askForKey(message) {
  if (waiting) return waiting;
  const dialog = document.getElementById("login");
  const form = document.getElementById("login-form");
  const input = document.getElementById("login-key");
  document.getElementById("login-message").textContent = message;
  input.value = "";
  waiting = new Promise((resolve) => {
    const done = (event) => {
      event.preventDefault();
      if (!input.value.trim()) return;
      sessionStorage.setItem(KEY, input.value.trim());
      form.removeEventListener("submit", done);
      dialog.close();
      waiting = null;
      resolve();
      document.dispatchEvent(new CustomEvent("routerd:signed-in"));
    };
    form.addEventListener("submit", done);
    dialog.addEventListener("cancel", (event) => event.preventDefault());
  });
  if (!dialog.open) dialog.showModal();
  input.focus();
  return waiting;
}

export async function request(method, path, body) {
  for (;;) {
    const headers = { accept: "application/json" };
    const key = storedKey();
    if (key) headers.authorization = "Bearer " + key;
    if (body !== undefined) headers["content-type"] = "application/json";
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
    if (response.status === 401) {
      const hadKey = Boolean(key);
      signOut();
      await askForKey(hadKey ? "That key was refused. Enter an admin key."
        : "This cluster asks for an admin key. It is kept for this tab only.");
      continue;
    }
    const text = await response.text();
    let payload = null;
    try {
      payload = text ? JSON.parse(text) : null;
    } catch {
      payload = null;
    }
    if (!response.ok) {
      const err = (payload && payload.error) || {};
      throw new ApiError(response.status, err.type || "http_error", err.code || String(response.status),
        err.message || text || response.statusText);
    }
    return payload;
  }
}

export const get = (path) => request("GET", path);
export const post = (path, body) => request("POST", path, body === undefined ? {} : body);
export const del = (path) => request("DELETE", path);

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    search.append(name, String(value));
  }
  const text = search.toString();
  return text ? "?" + text : "";
}
