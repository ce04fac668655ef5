// A share link's page (#18): the snapshot's messages, read-only. User text is only ever set as
// text; answers go through the chat's safe Markdown renderer, so nothing in a message runs.

import { renderMarkdown } from "./markdown.js";

const data = JSON.parse(document.getElementById("shared-data").textContent);
const list = document.getElementById("shared-messages");

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function messageItem(message) {
  const item = element("li", `message ${message.role}`);
  const answer = message.role === "assistant";
  const role = element("div", "message-role", answer ? `Assistant${message.model ? ` · ${message.model}` : ""}` : "User");
  const body = element("div", "message-body");
  if (answer) {
    body.classList.add("markdown");
    renderMarkdown(body, message.content);
  } else {
    body.textContent = message.content;
  }
  item.append(role, body);
  return item;
}

list.replaceChildren(...data.messages.map(messageItem));
