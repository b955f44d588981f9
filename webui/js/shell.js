// What the pages share with the shell: the error banner of the polling loop, the notices that keep
// an action's result on screen until the operator dismisses it, the confirmation of a destructive
// action, and the wake-up of the polling loop.  Pages import this module, never app.js (the shell
// imports the pages), so the imports stay one-way.

import { ApiError } from "./api.js";
import { h, replace, swap } from "./dom.js";

let wake = null;

/** Show `message` in the banner above the page; a falsy message hides the banner.  The polling loop
 * owns it (a refresh that works hides it again): an action's result goes to notify() instead. */
export function banner(message) {
  const el = document.getElementById("banner");
  if (!message) {
    el.hidden = true;
    return;
  }
  el.hidden = false;
  replace(el, message);
}

/** An error as the operator reads it: `502 load_failed: …` for an API error. */
export function describe(err) {
  return err instanceof ApiError ? `${err.status} ${err.code}: ${err.message}` : String(err);
}

export function showError(err) {
  if (err instanceof ApiError && err.status === 404 && err.message.includes("master only")) {
    const master = (err.message.match(/this node's master is (\S+)/) || [])[1];
    const ui = master && /^https?:\/\//.test(master) ? master.replace(/\/+$/, "") + "/ui/" : null;
    banner(h("span", {}, "This node is a slave: the site API is served by its master (or by a standalone node). ",
      ui ? h("a", { className: "master-link", href: ui }, `Open the WebUI on its master, ${ui}`)
        : "Open the WebUI on the master node."));
    return;
  }
  banner(describe(err));
}

/** Keep `text` above the page (kind "ok" or "error") until the operator dismisses it; a newer notice
 * of the same `action` takes the place of the older one.  Refreshes and page changes leave it. */
export function notify(kind, text, action) {
  const box = document.getElementById("notices");
  const notice = h("div", { className: "notice " + kind, role: kind === "error" ? "alert" : "status",
    dataset: { action: action || "" } },
  h("span", { className: "notice-time" }, new Date().toLocaleTimeString()), " ",
  h("span", { className: "notice-text" }, text), " ",
  h("button", { type: "button", className: "dismiss", title: "dismiss",
    onclick: (e) => e.currentTarget.closest(".notice").remove() }, "Dismiss"));
  const older = action ? [...box.children].find((n) => n.dataset.action === action) : null;
  if (older) older.replaceWith(notice);
  else box.prepend(notice);
  return notice;
}

/** Ask before a destructive action, in the #confirm dialog: `title`, `body` (text or nodes), the OK
 * button's label `ok`; with `acknowledge` (a label) OK stays disabled until that box is ticked.
 * Resolves true only when the operator confirmed: Cancel, Escape or closing resolve false. */
export function confirm({ title, body, ok = "Confirm", acknowledge }) {
  const dialog = document.getElementById("confirm");
  const okButton = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  document.getElementById("confirm-title").textContent = title;
  okButton.textContent = ok;
  const box = acknowledge ? h("input", { type: "checkbox", id: "acknowledge",
    onchange: (e) => { okButton.disabled = !e.currentTarget.checked; } }) : null;
  okButton.disabled = Boolean(box);
  swap(document.getElementById("confirm-body"), body, box ? h("label", {}, box, " ", acknowledge) : null);
  dialog.returnValue = "";
  return new Promise((resolve) => {
    const onCancel = () => dialog.close("cancel");
    const onClose = () => {
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("close", onClose);
      resolve(dialog.returnValue === "ok" && (!box || box.checked));
    };
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("close", onClose);
    dialog.showModal();
    cancel.focus(); // Enter does not confirm by accident
  });
}

/**
 * Run an operator's action: ask first when `ask` is given (confirm()'s argument); mark `button` busy
 * (disabled, aria-busy: refreshes leave it so) while `run()` is in flight; then keep the result in a
 * notice until it is dismissed — `done(result)` on success (default "<label>: done"), "<label> failed:
 * <reason>" on failure — and refresh the page.  Resolves to run()'s result, or undefined when the
 * operator did not confirm or the action failed.
 */
export async function act({ label, run, button, ask, done }) {
  if (ask && !(await confirm(ask))) return undefined;
  if (button) {
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
  }
  try {
    const result = await run();
    notify("ok", done ? done(result) : `${label}: done`, label);
    return result;
  } catch (err) {
    notify("error", `${label} failed: ${describe(err)}`, label);
    return undefined;
  } finally {
    if (button) {
      button.removeAttribute("aria-busy");
      button.disabled = false;
    }
    refreshNow();
  }
}

/** Refresh the current page now (after an action) instead of at the next tick. */
export function refreshNow() {
  if (wake) wake();
}

/** Wait `ms` milliseconds, or less when a page calls refreshNow() meanwhile. */
export function sleep(ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    wake = () => {
      clearTimeout(timer);
      resolve();
    };
  });
}
