// The sidebar: the user's conversations, newest activity first, with title search, rename,
// delete, and infinite scroll through the API's cursor.

import * as api from "./api.js";

const SVG = "http://www.w3.org/2000/svg";
const ICONS = {
  rename: "M4 20h4l10.5-10.5a2.1 2.1 0 0 0-4-4L4 16v4zM13.5 6.5l4 4",
  delete: "M4 7h16M10 11v6M14 11v6M6 7l1 13h10l1-13M9 7V4h6v3",
};

function icon(name) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", ICONS[name]);
  svg.append(path);
  return svg;
}

export const displayTitle = (conversation) => conversation.title || "New chat";

export class Sidebar {
  /** `handlers`: {onOpen(id), onDeleted(id), onChanged(conversation), onError(error)}. */
  constructor(handlers) {
    this.handlers = handlers;
    this.list = document.getElementById("conversation-list");
    this.note = document.getElementById("sidebar-note");
    this.nav = document.getElementById("conversation-nav");
    this.sentinel = document.getElementById("sidebar-sentinel");
    this.search = document.getElementById("search");
    this.query = "";
    this.cursor = null;
    this.exhausted = false;
    this.loading = false;
    this.epoch = 0;
    this.activeId = null;
    this.items = new Map(); // id -> {conversation, item}

    let timer = null;
    this.search.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        this.query = this.search.value.trim();
        this.reload();
      }, 250);
    });
    new IntersectionObserver((entries) => {
      if (entries.some((entry) => entry.isIntersecting)) this.loadMore();
    }, { root: this.nav, rootMargin: "0px 0px 120px 0px" }).observe(this.sentinel);
  }

  /** Start over from the first page (the search changed). */
  async reload() {
    this.epoch += 1;
    this.cursor = null;
    this.exhausted = false;
    this.loading = false;
    this.items.clear();
    this.list.replaceChildren();
    await this.loadMore();
  }

  async loadMore() {
    if (this.loading || this.exhausted) return;
    const epoch = this.epoch;
    this.loading = true;
    this.note.textContent = "Loading…";
    let page;
    try {
      page = await api.listConversations({ q: this.query, cursor: this.cursor });
    } catch (error) {
      if (epoch === this.epoch) {
        this.loading = false;
        this.note.textContent = "Could not load your conversations.";
      }
      this.handlers.onError(error);
      return;
    }
    if (epoch !== this.epoch) return;
    for (const conversation of page.results) this.upsert(conversation, { top: false });
    this.cursor = page.next_cursor;
    this.exhausted = !page.next_cursor;
    this.loading = false;
    this.updateNote();
    if (!this.exhausted && this.sentinelInView()) this.loadMore();
  }

  /** Bring the first page up to date (new activity or a new title) without losing the rest. */
  async refreshTop() {
    const epoch = this.epoch;
    let page;
    try {
      page = await api.listConversations({ q: this.query });
    } catch {
      return;
    }
    if (epoch !== this.epoch) return;
    for (const conversation of [...page.results].reverse()) {
      this.upsert(conversation, { top: true });
      this.handlers.onChanged(conversation);
    }
    this.updateNote();
  }

  sentinelInView() {
    const box = this.nav.getBoundingClientRect();
    const mark = this.sentinel.getBoundingClientRect();
    return box.height > 0 && mark.top <= box.bottom + 120;
  }

  updateNote() {
    if (this.items.size === 0) {
      this.note.textContent = this.query ? "No conversation title matches." : "No conversations yet.";
    } else {
      this.note.textContent = "";
    }
  }

  setActive(id) {
    this.activeId = id;
    for (const [key, { item }] of this.items) {
      const link = item.querySelector(".conversation-link");
      if (key === id) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  /** Add a conversation or update its row; `top` moves it to the head of the list. */
  upsert(conversation, { top }) {
    const known = this.items.get(conversation.id);
    if (known) {
      known.conversation = conversation;
      this.fill(known.item, conversation);
      if (top) this.list.prepend(known.item);
      return;
    }
    const item = this.build(conversation);
    this.items.set(conversation.id, { conversation, item });
    if (top) this.list.prepend(item);
    else this.list.append(item);
    this.updateNote();
  }

  /** A title written in the background (an event): update the row if it is listed. */
  applyTitle(id, title) {
    const known = this.items.get(id);
    if (!known || known.conversation.title_set_by_user) return null;
    known.conversation = { ...known.conversation, title };
    this.fill(known.item, known.conversation);
    return known.conversation;
  }

  remove(id) {
    const known = this.items.get(id);
    if (!known) return;
    known.item.remove();
    this.items.delete(id);
    this.updateNote();
  }

  build(conversation) {
    const item = document.createElement("li");
    item.className = "conversation-item";
    item.dataset.conversationId = conversation.id;
    const link = document.createElement("a");
    link.className = "conversation-link";
    link.href = `/c/${encodeURIComponent(conversation.id)}`;
    link.addEventListener("click", (event) => {
      if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey || event.button !== 0) return;
      event.preventDefault();
      this.handlers.onOpen(conversation.id);
    });
    const actions = document.createElement("div");
    actions.className = "item-actions";
    const rename = document.createElement("button");
    rename.type = "button";
    rename.className = "icon-button rename";
    rename.append(icon("rename"));
    rename.addEventListener("click", () => this.startRename(conversation.id));
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon-button delete";
    remove.append(icon("delete"));
    remove.addEventListener("click", () => this.confirmDelete(conversation.id));
    actions.append(rename, remove);
    item.append(link, actions);
    this.fill(item, conversation);
    if (conversation.id === this.activeId) link.setAttribute("aria-current", "page");
    return item;
  }

  fill(item, conversation) {
    const title = displayTitle(conversation);
    item.querySelector(".conversation-link").textContent = title;
    item.querySelector(".rename").setAttribute("aria-label", `Rename “${title}”`);
    item.querySelector(".delete").setAttribute("aria-label", `Delete “${title}”`);
  }

  startRename(id) {
    const known = this.items.get(id);
    if (!known || known.item.querySelector(".rename-form")) return;
    const { item } = known;
    const link = item.querySelector(".conversation-link");
    const form = document.createElement("form");
    form.className = "rename-form";
    const input = document.createElement("input");
    input.type = "text";
    input.maxLength = 200;
    input.value = known.conversation.title;
    input.setAttribute("aria-label", "New title");
    form.append(input);
    link.hidden = true;
    item.classList.add("renaming");
    link.after(form);
    input.focus();
    input.select();

    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      form.remove();
      link.hidden = false;
      item.classList.remove("renaming");
    };
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const title = input.value.trim();
      if (!title || title === known.conversation.title) {
        finish();
        link.focus();
        return;
      }
      input.disabled = true;
      try {
        const renamed = await api.renameConversation(id, title);
        finish();
        this.upsert(renamed, { top: false });
        this.handlers.onChanged(renamed);
        link.focus();
      } catch (error) {
        input.disabled = false;
        input.focus();
        this.handlers.onError(error);
      }
    });
    input.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        event.stopPropagation();
        finish();
        link.focus();
      }
    });
    input.addEventListener("blur", () => {
      if (!input.disabled) finish();
    });
  }

  async confirmDelete(id) {
    const known = this.items.get(id);
    if (!known) return;
    const title = displayTitle(known.conversation);
    // The native dialog is accessible and keyboard-friendly with no markup of its own.
    if (!window.confirm(`Delete “${title}”? This cannot be undone.`)) return;
    try {
      await api.deleteConversation(id);
    } catch (error) {
      this.handlers.onError(error);
      return;
    }
    this.remove(id);
    this.handlers.onDeleted(id);
  }
}
