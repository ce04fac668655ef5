// Share links (#18): a dialog that makes a read-only link to the conversation on screen (a
// snapshot of its branch as it is now) and lists the user's links, each to copy again or
// revoke. Titles are only ever set as text.

import * as api from "./api.js";
import { copyButton } from "./markdown.js";

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const DATE = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });

export class ShareDialog {
  /** `handlers`: {conversationId() -> the id on screen or null}; errors show in the dialog. */
  constructor(handlers) {
    this.handlers = handlers;
    this.dialog = document.getElementById("share-dialog");
    this.createSection = document.getElementById("share-create-section");
    this.createButton = document.getElementById("share-create");
    this.linkBox = document.getElementById("share-link");
    this.urlInput = document.getElementById("share-url");
    this.note = document.getElementById("share-note");
    this.list = document.getElementById("share-list");
    this.opener = null;
    this.linkBox.append(copyButton(() => this.urlInput.value, "Copy the link"));

    document.getElementById("share-open").addEventListener("click", (event) => this.open(event.currentTarget, true));
    document.getElementById("shares-open").addEventListener("click", (event) => this.open(event.currentTarget, false));
    document.getElementById("share-close").addEventListener("click", () => this.close());
    this.createButton.addEventListener("click", () => this.create());
    this.urlInput.addEventListener("focus", () => this.urlInput.select());
    // Escape closes the dialog and goes no further (the page's Escape stops an answer).
    this.dialog.addEventListener("keydown", (event) => {
      if (event.key !== "Escape") return;
      event.preventDefault();
      event.stopPropagation();
      this.close();
    });
  }

  /** Show the dialog: with the Create button when `forConversation`, else the list only. */
  open(opener, forConversation) {
    this.opener = opener;
    const conversationId = forConversation ? this.handlers.conversationId() : null;
    this.createSection.hidden = !conversationId;
    this.linkBox.hidden = true;
    this.urlInput.value = "";
    this.createButton.disabled = false;
    if (!this.dialog.open) this.dialog.showModal();
    (conversationId ? this.createButton : document.getElementById("share-close")).focus();
    this.load();
  }

  close() {
    if (this.dialog.open) this.dialog.close();
    if (this.opener) this.opener.focus();
  }

  async create() {
    const conversationId = this.handlers.conversationId();
    if (!conversationId) return;
    this.createButton.disabled = true;
    this.note.textContent = "Creating the link…";
    let share;
    try {
      share = await api.shareConversation(conversationId);
    } catch (error) {
      this.note.textContent = error.message;
      this.createButton.disabled = false;
      return;
    }
    this.urlInput.value = share.url;
    this.linkBox.hidden = false;
    this.createButton.disabled = false;
    this.urlInput.focus();
    await this.load();
    this.note.textContent = "Link created.";
  }

  async load() {
    let page;
    try {
      page = await api.listShares();
    } catch (error) {
      this.note.textContent = error.message;
      return;
    }
    this.list.replaceChildren(...page.results.map((share) => this.build(share)));
    this.note.textContent = page.results.length ? "" : "You have not shared any conversation yet.";
  }

  build(share) {
    const item = element("li", "share-item");
    item.dataset.shareId = share.id;
    item.dataset.revoked = String(share.revoked);
    const head = element("div", "share-item-head");
    if (share.revoked) {
      head.append(element("span", "share-item-title", share.title));
    } else {
      const link = element("a", "share-item-title", share.title);
      link.href = share.url;
      link.target = "_blank";
      link.rel = "noopener noreferrer";
      head.append(link);
    }
    const when = element("span", "share-item-when", DATE.format(new Date(share.created_at)));
    head.append(when);
    item.append(head);
    const actions = element("div", "share-item-actions");
    if (share.revoked) {
      actions.append(element("span", "share-item-revoked", "Revoked"));
    } else {
      actions.append(copyButton(() => share.url, `Copy the link to “${share.title}”`));
      const revoke = element("button", "action", "Revoke");
      revoke.type = "button";
      revoke.setAttribute("aria-label", `Revoke the link to “${share.title}”`);
      revoke.addEventListener("click", () => this.revoke(share, revoke));
      actions.append(revoke);
    }
    item.append(actions);
    return item;
  }

  async revoke(share, control) {
    control.disabled = true;
    try {
      await api.revokeShare(share.id);
    } catch (error) {
      control.disabled = false;
      this.note.textContent = error.message;
      return;
    }
    if (this.urlInput.value === share.url) this.linkBox.hidden = true;
    await this.load();
    this.note.textContent = "Link revoked: it no longer opens.";
  }
}
