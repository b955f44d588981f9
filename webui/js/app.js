// The WebUI shell: tabs by URL hash, one page mounted at a time, refreshed by polling every
// POLL_MS while the tab is visible (paused while it is hidden), and errors shown in the banner.
// What the pages need of the shell (showError, refreshNow) lives in shell.js, which they import.

import { signOut, storedKey } from "./api.js";
import { banner, showError, sleep } from "./shell.js";
import { h, swap } from "./dom.js";
import * as nodes from "./nodes.js";
import * as models from "./models.js";
import * as lending from "./lending.js";
import * as links from "./links.js";
import * as overview from "./overview.js";
import * as analytics from "./analytics.js";
import * as bench from "./bench.js";
import * as errors from "./errors.js";
import * as requests from "./requests.js";
import * as cook from "./cook.js";

export const POLL_MS = 1500;
const PAGES = { overview, nodes, models, lending, links, analytics, bench, requests, errors, cook };

const state = { name: null, page: null, ctx: null, generation: 0 };

function status(text) {
  document.getElementById("status").textContent = text;
  document.getElementById("signout").hidden = !storedKey();
}

function visible() {
  if (!document.hidden) return Promise.resolve();
  return new Promise((resolve) => {
    const seen = () => {
      if (document.hidden) return;
      document.removeEventListener("visibilitychange", seen);
      resolve();
    };
    document.addEventListener("visibilitychange", seen);
  });
}

async function loop(generation) {
  while (generation === state.generation) {
    await visible();
    if (generation !== state.generation) return;
    try {
      await state.page.refresh(state.ctx);
      if (generation !== state.generation) return;
      banner(null);
      status("updated " + new Date().toLocaleTimeString());
    } catch (err) {
      if (generation !== state.generation) return;
      showError(err);
      status("refresh failed");
    }
    await sleep(POLL_MS);
  }
}

function show(name) {
  if (!PAGES[name]) name = "overview";
  if (state.page && state.page.unmount) state.page.unmount(state.ctx);
  state.generation += 1;
  state.name = name;
  state.page = PAGES[name];
  for (const link of document.querySelectorAll("#tabs a")) {
    link.classList.toggle("active", link.dataset.page === name);
  }
  const root = document.getElementById("page");
  const container = h("section", { id: "page-" + name, className: "page" });
  swap(root, container); // a new page: its own elements, never a patch of the last one
  state.ctx = state.page.mount(container);
  loop(state.generation);
}

document.getElementById("signout").addEventListener("click", () => {
  signOut();
  location.reload();
});
window.addEventListener("hashchange", () => show(location.hash.slice(1)));
show(location.hash.slice(1) || "overview");
