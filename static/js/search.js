// Message search (#18): a dialog that searches the text of the user's messages and opens a
// result on the branch that holds it. A snippet arrives as plain text with its matches as
// offsets (in Unicode code points); it is built here from text nodes and <mark> elements, so
// no markup from the server or from a message ever reaches the page.

import * as api from "./api.js";

const ROLES = { user: "You", assistant: "Answer" };

/** The snippet as nodes: its text, with each [start, end) of `highlights` in a <mark>. */
export function markedSnippet(snippet, highlights) {
  const chars = Array.from(snippet);
  const nodes = [];
  let position = 0;
  for (const [start, end] of highlights) {
    if (start < position || end <= start || end > chars.length) continue;
    if (start > position) nodes.push(document.createTextNode(chars.slice(position, start).join("")));
    const mark = document.createElement("mark");
    mark.textContent = chars.slice(start, end).join("");
    nodes.push(mark);
    position = end;
  }
  if (position < chars.length) nodes.push(document.createTextNode(chars.slice(position).join("")));
  return nodes;
}

export class MessageSearch {
  /** `handlers`: {onOpenMessage(conversationId, messageId), onError(error)}. */
  constructor(handlers) {
    this.handlers = handlers;
    this.dialog = document.getElementById("search-dialog");
    this.form = document.getElementById("search-form");
    this.input = document.getElementById("search-query");
    this.note = document.getElementById("search-note");
    this.results = document.getElementById("search-results");
    this.more = document.getElementById("search-more");
    this.opener = document.getElementById("search-messages");
    this.query = "";
    this.cursor = null;
    this.epoch = 0;

    this.opener.addEventListener("click", () => this.open());
    document.getElementById("search-close").addEventListener("click", () => this.close());
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.run(this.input.value.trim());
    });
    this.more.addEventListener("click", () => this.loadMore());
    // Escape closes the dialog and goes no further (the page's Escape stops an answer).
    this.dialog.addEventListener("keydown", (event) => {
      if (event.key !== "Escape") return;
      event.preventDefault();
      event.stopPropagation();
      this.close();
    });
  }

  open() {
    if (!this.dialog.open) this.dialog.showModal();
    this.input.focus();
    this.input.select();
  }

  close() {
    if (this.dialog.open) this.dialog.close();
    this.opener.focus();
  }

  async run(query) {
    this.epoch += 1;
    this.query = query;
    this.cursor = null;
    this.results.replaceChildren();
    this.more.hidden = true;
    if (!query) {
      this.note.textContent = "";
      return;
    }
    await this.loadMore();
  }

  async loadMore() {
    const epoch = this.epoch;
    this.note.textContent = "Searching…";
    let page;
    try {
      page = await api.searchMessages({ q: this.query, cursor: this.cursor });
    } catch (error) {
      if (epoch !== this.epoch) return;
      this.note.textContent = error.message;
      return;
    }
    if (epoch !== this.epoch) return;
    for (const hit of page.results) this.results.append(this.build(hit));
    this.cursor = page.next_cursor;
    this.more.hidden = !page.next_cursor;
    const count = this.results.childElementCount;
    this.note.textContent = count ? `${count}${page.next_cursor ? "+" : ""} found.` : "No message matches.";
  }

  build(hit) {
    const item = document.createElement("li");
    item.className = "search-result";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "search-result-open";
    button.dataset.hitId = hit.message_id;
    const title = document.createElement("span");
    title.className = "search-result-title";
    title.textContent = `${hit.conversation_title || "New chat"} · ${ROLES[hit.role] ?? hit.role}`;
    const snippet = document.createElement("span");
    snippet.className = "search-result-snippet";
    snippet.append(...markedSnippet(hit.snippet, hit.highlights));
    button.append(title, snippet);
    button.addEventListener("click", () => {
      this.dialog.close();
      this.handlers.onOpenMessage(hit.conversation_id, hit.message_id);
    });
    item.append(button);
    return item;
  }
}
