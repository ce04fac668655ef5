// The header's Export menu (#18): download the conversation on screen as JSON (its whole tree)
// or Markdown (the branch on screen). Links only: the browser downloads them with the session.

import { exportUrl } from "./api.js";

const menu = document.getElementById("export-menu");
const asJson = document.getElementById("export-json");
const asMarkdown = document.getElementById("export-markdown");

/** Point the menu at `conversation` (the detail on screen), or hide it for a new chat. */
export function showExport(conversation) {
  if (!menu) return;
  menu.hidden = !conversation;
  menu.open = false;
  if (!conversation) return;
  asJson.href = exportUrl(conversation.id, "json");
  asMarkdown.href = exportUrl(conversation.id, "markdown");
}
