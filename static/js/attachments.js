// Attachments in the web chat (#18): the composer's tray of files to send, and the chips
// of the files a sent message carries.
//
// A file chosen while a conversation is on screen is uploaded at once, so a refusal (too
// large, not text or PDF, a PDF without text) shows on its chip straight away; in a new chat
// it waits for the send, which first creates the conversation. The send carries the ids of
// the uploaded files. A chip's × takes a file back (an uploaded one is discarded on the server).
// Names and messages are only ever set as text.

import * as api from "./api.js";

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A size as people read it: 812 B, 14.2 KB, 3.1 MB. */
export function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

/** The chips of the files a sent message carries, each a download link; null if none. */
export function attachmentList(attachments) {
  if (!attachments || attachments.length === 0) return null;
  const list = element("ul", "attachment-chips sent");
  list.setAttribute("aria-label", "Attached files");
  for (const attachment of attachments) {
    const item = element("li", "attachment-chip");
    item.dataset.kind = attachment.kind;
    const link = element("a", "attachment-name", attachment.name);
    link.href = attachment.url;
    link.download = attachment.name;
    item.append(link, element("span", "attachment-size", formatSize(attachment.size)));
    list.append(item);
  }
  return list;
}

export class AttachmentTray {
  constructor({ list, input, button }) {
    this.list = list;
    this.items = []; // {file, state: waiting|uploading|ready|refused, attachment, error, upload}
    this.conversationId = null;
    button.addEventListener("click", () => input.click());
    input.addEventListener("change", () => {
      this.add([...input.files]);
      input.value = "";
    });
  }

  /** The conversation on screen changed: files not sent are let go. */
  reset(conversationId) {
    for (const item of this.items) this.discard(item);
    this.items = [];
    this.conversationId = conversationId;
    this.render();
  }

  add(files) {
    for (const file of files) {
      const item = { file, state: "waiting", attachment: null, error: null, upload: null };
      this.items.push(item);
      if (this.conversationId) this.upload(item, this.conversationId);
    }
    this.render();
  }

  upload(item, conversationId) {
    item.state = "uploading";
    item.upload = api
      .uploadAttachment(conversationId, item.file)
      .then((attachment) => {
        item.attachment = attachment;
        item.state = "ready";
      })
      .catch((error) => {
        item.error = error;
        item.state = "refused";
      })
      .finally(() => {
        // Removed meanwhile: the file is not wanted after all.
        if (!this.items.includes(item)) this.discard(item);
        this.render();
      });
    return item.upload;
  }

  discard(item) {
    if (item.state === "ready" && item.attachment) {
      api.discardAttachment(item.attachment.conversation_id, item.attachment.id).catch(() => {});
    }
  }

  remove(item) {
    this.items = this.items.filter((other) => other !== item);
    this.discard(item);
    this.render();
  }

  get refused() {
    return this.items.filter((item) => item.state === "refused");
  }

  get isEmpty() {
    return this.items.length === 0;
  }

  /**
   * Upload what still waits (a new chat's files, once it exists) and wait for every upload:
   * the ids to send, or an error naming the refused files.
   */
  async ready(conversationId) {
    this.conversationId = conversationId;
    for (const item of this.items) {
      if (item.state === "waiting") this.upload(item, conversationId);
    }
    this.render();
    await Promise.all(this.items.map((item) => item.upload));
    const refused = this.refused;
    if (refused.length) {
      const names = refused.map((item) => item.file.name).join(", ");
      throw new Error(`Some files were refused (${names}): remove them to send.`);
    }
    return this.items.map((item) => item.attachment.id);
  }

  /** The message went: its files are on it now. */
  sent() {
    this.items = [];
    this.render();
  }

  render() {
    const chips = this.items.map((item) => this.chip(item));
    this.list.replaceChildren(...chips);
    this.list.hidden = chips.length === 0;
  }

  chip(item) {
    const chip = element("li", "attachment-chip");
    chip.dataset.state = item.state;
    chip.append(element("span", "attachment-name", item.file.name));
    chip.append(element("span", "attachment-size", formatSize(item.file.size)));
    if (item.state === "uploading") chip.append(element("span", "attachment-state", "uploading…"));
    if (item.state === "refused") {
      const error = element("span", "attachment-error", item.error.message);
      error.setAttribute("role", "alert");
      chip.append(error);
    }
    const remove = element("button", "attachment-remove", "×");
    remove.type = "button";
    remove.setAttribute("aria-label", `Remove ${item.file.name}`);
    remove.addEventListener("click", () => this.remove(item));
    chip.append(remove);
    return chip;
  }
}
