// The tools control of the web chat: which tools the model may call in this conversation.
// Lists the tools the user's plan offers (GET /api/v1/conversations/<id>/tools) as
// checkboxes; a change is saved at once (PATCH, with the CSRF header) and undone on failure.

import { getConversationTools, setConversationTools } from "./api.js";

export class ToolsMenu {
  constructor({ root, list, note }) {
    this.root = root;
    this.list = list;
    this.note = note;
    this.conversationId = null;
  }

  /** Show the tools of `conversationId`, or hide the control (a new chat has none yet). */
  async show(conversationId) {
    this.conversationId = conversationId;
    this.root.hidden = !conversationId;
    this.list.replaceChildren();
    this.note.textContent = "";
    if (!conversationId) return;
    let data;
    try {
      data = await getConversationTools(conversationId);
    } catch (error) {
      if (this.conversationId === conversationId) this.note.textContent = error.message;
      return;
    }
    if (this.conversationId !== conversationId) return;
    this.render(data.tools);
  }

  render(tools) {
    this.list.replaceChildren();
    const summary = this.root.querySelector("summary");
    if (!tools.length) {
      summary.textContent = "Tools";
      this.note.textContent = "No tools are available on your plan.";
      return;
    }
    const enabled = tools.filter((tool) => tool.enabled).length;
    summary.textContent = `Tools (${enabled}/${tools.length})`;
    for (const tool of tools) {
      const item = document.createElement("li");
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = tool.enabled;
      box.dataset.tool = tool.name;
      box.addEventListener("change", () => this.toggle(box));
      const name = document.createElement("span");
      name.className = "tool-name";
      name.textContent = tool.name;
      label.title = tool.description;
      label.append(box, name);
      item.append(label);
      this.list.append(item);
    }
  }

  async toggle(box) {
    const conversationId = this.conversationId;
    box.disabled = true;
    try {
      const data = await setConversationTools(conversationId, { [box.dataset.tool]: box.checked });
      if (this.conversationId === conversationId) {
        this.note.textContent = "";
        this.render(data.tools);
      }
    } catch (error) {
      box.checked = !box.checked;
      box.disabled = false;
      this.note.textContent = error.message;
    }
  }
}
