// The sidebar: the user's conversations, pinned first, then newest activity first, grouped
// by folder, with title search, rename, delete, pin, archive, move to a folder, the Archived
// view, and infinite scroll through the API's cursor.

import * as api from "./api.js";

const SVG = "http://www.w3.org/2000/svg";
const ICONS = {
  rename: "M4 20h4l10.5-10.5a2.1 2.1 0 0 0-4-4L4 16v4zM13.5 6.5l4 4",
  delete: "M4 7h16M10 11v6M14 11v6M6 7l1 13h10l1-13M9 7V4h6v3",
  pin: "M9 4h6l-1 6 4 4H6l4-4-1-6zM12 14v6",
  archive: "M4 5h16v4H4zM6 9v10h12V9M10 13h4",
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
    // Folders, pins, archive (#18): where each row goes.
    this.pinnedGroup = document.getElementById("pinned-group");
    this.pinnedList = document.getElementById("pinned-list");
    this.folderGroups = document.getElementById("folder-groups");
    this.archivedTitle = document.getElementById("archived-title");
    this.archivedToggle = document.getElementById("show-archived");
    this.archived = false;
    this.folders = new Map(); // id -> {folder, group, list}
    this.archivedToggle.addEventListener("click", () => this.showArchived(!this.archived));
    document.getElementById("new-folder").addEventListener("click", () => this.createFolder());
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

  /** Start over from the first page (the search, the view or the folders changed). */
  async reload() {
    this.epoch += 1;
    const epoch = this.epoch;
    this.cursor = null;
    this.exhausted = false;
    // No page before the folders its rows go into are known.
    this.loading = true;
    this.items.clear();
    this.list.replaceChildren();
    this.pinnedList.replaceChildren();
    await this.loadFolders();
    if (epoch !== this.epoch) return;
    this.loading = false;
    await this.loadMore();
  }

  async loadMore() {
    if (this.loading || this.exhausted) return;
    const epoch = this.epoch;
    this.loading = true;
    this.note.textContent = "Loading…";
    let page;
    try {
      page = await api.listConversations({ q: this.query, cursor: this.cursor, archived: this.archived });
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
      page = await api.listConversations({ q: this.query, archived: this.archived });
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
      if (this.query) this.note.textContent = "No conversation title matches.";
      else this.note.textContent = this.archived ? "No archived conversations." : "No conversations yet.";
    } else {
      this.note.textContent = "";
    }
    this.pinnedGroup.hidden = this.pinnedList.childElementCount === 0;
  }

  setActive(id) {
    this.activeId = id;
    for (const [key, { item }] of this.items) {
      const link = item.querySelector(".conversation-link");
      if (key === id) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  /** Add a conversation or update its row; `top` moves it to the head of its group. */
  upsert(conversation, { top }) {
    if (Boolean(conversation.archived) !== this.archived) {
      this.remove(conversation.id);
      return;
    }
    const container = this.containerFor(conversation);
    const known = this.items.get(conversation.id);
    if (known) {
      known.conversation = conversation;
      this.fill(known.item, conversation);
      if (top) container.prepend(known.item);
      else if (known.item.parentElement !== container) this.place(known.item, container);
      this.updateNote();
      return;
    }
    const item = this.build(conversation);
    this.items.set(conversation.id, { conversation, item });
    if (top) container.prepend(item);
    else container.append(item);
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

  // Folders, pins, archive (#18)

  /** The list a row belongs in: Pinned, its folder's, or the main one (also the Archived view). */
  containerFor(conversation) {
    if (this.archived) return this.list;
    if (conversation.pinned) return this.pinnedList;
    const folder = conversation.folder_id && this.folders.get(conversation.folder_id);
    return folder ? folder.list : this.list;
  }

  /** Put a moved row where the list's order (pinned, newest activity) says it goes. */
  place(item, container) {
    const stamp = this.items.get(item.dataset.conversationId).conversation.last_activity_at;
    const next = [...container.children].find(
      (other) => this.items.get(other.dataset.conversationId)?.conversation.last_activity_at < stamp,
    );
    container.insertBefore(item, next ?? null);
  }

  async loadFolders() {
    let folders;
    try {
      folders = (await api.listFolders()).results;
    } catch (error) {
      this.handlers.onError(error);
      folders = [];
    }
    this.folders.clear();
    this.folderGroups.replaceChildren();
    for (const folder of folders) this.addFolderGroup(folder);
    this.folderGroups.hidden = this.archived;
  }

  addFolderGroup(folder) {
    const group = document.createElement("section");
    group.className = "conversation-group folder-group";
    group.dataset.folderId = folder.id;
    const head = document.createElement("div");
    head.className = "folder-head";
    const toggle = document.createElement("button");
    toggle.type = "button";
    toggle.className = "folder-toggle";
    toggle.setAttribute("aria-expanded", "true");
    const list = document.createElement("ul");
    list.className = "conversation-list";
    list.id = `folder-${folder.id}`;
    toggle.setAttribute("aria-controls", list.id);
    toggle.addEventListener("click", () => {
      const open = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", String(open));
      list.hidden = !open;
    });
    const rename = document.createElement("button");
    rename.type = "button";
    rename.className = "icon-button";
    rename.append(icon("rename"));
    rename.addEventListener("click", () => this.renameFolder(folder.id));
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon-button";
    remove.append(icon("delete"));
    remove.addEventListener("click", () => this.deleteFolder(folder.id));
    head.append(toggle, rename, remove);
    group.append(head, list);
    this.folderGroups.append(group);
    const entry = { folder, group, list, toggle, rename, remove };
    this.folders.set(folder.id, entry);
    this.fillFolder(entry);
  }

  fillFolder({ folder, toggle, rename, remove }) {
    toggle.textContent = folder.name;
    rename.setAttribute("aria-label", `Rename folder “${folder.name}”`);
    remove.setAttribute("aria-label", `Delete folder “${folder.name}”`);
  }

  async createFolder() {
    // The native prompt is accessible and keyboard-friendly with no markup of its own.
    const name = window.prompt("Name of the new folder");
    if (!name || !name.trim()) return;
    try {
      await api.createFolder(name);
    } catch (error) {
      this.handlers.onError(error);
      return;
    }
    await this.reload();
  }

  async renameFolder(id) {
    const entry = this.folders.get(id);
    if (!entry) return;
    const name = window.prompt("New name of the folder", entry.folder.name);
    if (!name || !name.trim() || name === entry.folder.name) return;
    try {
      entry.folder = await api.renameFolder(id, name);
    } catch (error) {
      this.handlers.onError(error);
      return;
    }
    this.fillFolder(entry);
    for (const { item, conversation } of this.items.values()) this.fill(item, conversation);
  }

  async deleteFolder(id) {
    const entry = this.folders.get(id);
    if (!entry) return;
    const question = `Delete the folder “${entry.folder.name}”? Its conversations are kept, outside any folder.`;
    if (!window.confirm(question)) return;
    try {
      await api.deleteFolder(id);
    } catch (error) {
      this.handlers.onError(error);
      return;
    }
    await this.reload();
  }

  /** Switch between the main list and the Archived view. */
  async showArchived(archived) {
    this.archived = archived;
    this.archivedToggle.setAttribute("aria-pressed", String(archived));
    this.archivedTitle.hidden = !archived;
    await this.reload();
  }

  async organize(id, changes) {
    let conversation;
    try {
      conversation = await api.organizeConversation(id, changes);
    } catch (error) {
      this.handlers.onError(error);
      return;
    }
    const focused = this.items.get(id)?.item.contains(document.activeElement);
    this.upsert(conversation, { top: false });
    this.handlers.onChanged(conversation);
    // Keep the keyboard where it was: on the row's own control, or on the list if it left.
    const known = this.items.get(id);
    if (!focused) return;
    if (known) known.item.querySelector(".conversation-link").focus();
    else this.archivedToggle.focus();
  }

  folderOptions(select, conversation) {
    const none = new Option("No folder", "");
    const options = [none];
    for (const { folder } of this.folders.values()) options.push(new Option(folder.name, folder.id));
    select.replaceChildren(...options);
    select.value = conversation.folder_id && this.folders.has(conversation.folder_id) ? conversation.folder_id : "";
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
    const pin = document.createElement("button");
    pin.type = "button";
    pin.className = "icon-button pin";
    pin.append(icon("pin"));
    pin.addEventListener("click", () => {
      const { conversation: current } = this.items.get(conversation.id);
      this.organize(conversation.id, { pinned: !current.pinned });
    });
    const archive = document.createElement("button");
    archive.type = "button";
    archive.className = "icon-button archive";
    archive.append(icon("archive"));
    archive.addEventListener("click", () => {
      const { conversation: current } = this.items.get(conversation.id);
      this.organize(conversation.id, { archived: !current.archived });
    });
    const move = document.createElement("select");
    move.className = "move-to-folder";
    move.addEventListener("change", () => this.organize(conversation.id, { folder_id: move.value || null }));
    actions.append(pin, archive, move, rename, remove);
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
    const pin = item.querySelector(".pin");
    pin.setAttribute("aria-label", `${conversation.pinned ? "Unpin" : "Pin"} “${title}”`);
    pin.setAttribute("aria-pressed", String(Boolean(conversation.pinned)));
    pin.hidden = this.archived;
    item.querySelector(".archive").setAttribute("aria-label", `${conversation.archived ? "Unarchive" : "Archive"} “${title}”`);
    const move = item.querySelector(".move-to-folder");
    move.setAttribute("aria-label", `Folder of “${title}”`);
    move.hidden = this.archived || this.folders.size === 0;
    this.folderOptions(move, conversation);
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
