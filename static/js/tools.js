// The tools control of the web chat: which tools the model may call in this conversation.
// Lists the tools the user's plan offers (GET /api/v1/conversations/<id>/tools) as
// checkboxes; a change is saved at once (PATCH, with the CSRF header) and undone on failure.

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === "csrftoken") return decodeURIComponent(rest.join("="));
  }
  return "";
}

async function toolsRequest(method, conversationId, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    headers["X-CSRFToken"] = csrfToken();
  }
  const response = await fetch(`/api/v1/conversations/${encodeURIComponent(conversationId)}/tools`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error((data && data.error && data.error.message) || `The server answered ${response.status}.`);
  }
  return data;
}

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
      data = await toolsRequest("GET", conversationId);
    } catch (error) {
      if (this.conversationId === conversationId) this.note.textContent = error.message;
      return;
    }
    if (this.conversationId !== conversationId) return;
    this.render(data.tools);
  }

  render(tools) {
    this.list.replaceChildren();
    if (!tools.length) {
      this.note.textContent = "No tools are available on your plan.";
      return;
    }
    const enabled = tools.filter((tool) => tool.enabled).length;
    this.root.querySelector("summary").textContent = `Tools (${enabled}/${tools.length})`;
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
      const data = await toolsRequest("PATCH", conversationId, { tools: { [box.dataset.tool]: box.checked } });
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
