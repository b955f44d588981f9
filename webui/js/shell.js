// What the pages share with the shell: the error banner and the wake-up of the polling loop.
// Pages import this module, never app.js (the shell imports the pages), so the imports stay one-way.

import { ApiError } from "./api.js";
import { h, replace } from "./dom.js";

let wake = null;

/** Show `message` in the banner above the page; a falsy message hides the banner. */
export function banner(message) {
  const el = document.getElementById("banner");
  if (!message) {
    el.hidden = true;
    return;
  }
  el.hidden = false;
  replace(el, message);
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
  banner(err instanceof ApiError ? `${err.status} ${err.code}: ${err.message}` : String(err));
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
