// The decision log's enumeration values in words (lending-words.json: one entry per value the code
// can write, checked by tests/unit/test_lending_words.py). The page shows the words and keeps the
// code as the tooltip, so an operator can still search the log or the CLI for it.

import WORDS from "./lending-words.json" with { type: "json" };
import { h } from "./dom.js";

/** The values of one section ("kinds", "outcomes", "reasons", "triggers", "service_sources"). */
export function values(section) {
  return Object.keys(WORDS[section]);
}

/** The words for `code` (the code itself when the table has none, so nothing is ever hidden). */
export function words(section, code) {
  if (!code) return "";
  return WORDS[section][code] || code;
}

/** A span showing `code` in words, the code as its tooltip; "" for no code. */
export function said(section, code) {
  if (!code) return "";
  return h("span", { className: "said", title: code, dataset: { code } }, words(section, code));
}
