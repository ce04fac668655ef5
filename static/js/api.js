// The JSON API client: every request of the web chat goes through `request`, so the CSRF
// header, the error shape and network failures are handled in one place.

const BASE = "/api/v1/";

// This page's own id: it reads answers' streams under it and names it when it goes away, so
// the server can tell its streams from another tab's. Random per page load, so a reload is
// another page.
const PAGE_ID = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) =>
  b.toString(16).padStart(2, "0"),
).join("");

/** An error the API answered (`{"error": {code, message, detail}}`) or a network failure. */
export class ApiError extends Error {
  constructor(status, code, message, detail = null, retryAfter = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.retryAfter = retryAfter;
  }
}

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === "csrftoken") return decodeURIComponent(rest.join("="));
  }
  return "";
}

async function request(method, path, body) {
  const headers = { Accept: "application/json" };
  // A form (a file upload) sets its own multipart Content-Type, boundary included.
  const isForm = body instanceof FormData;
  if (body !== undefined && !isForm) headers["Content-Type"] = "application/json";
  // A form (a file's upload) sets its own multipart type and boundary.
  const form = body instanceof FormData;
  if (body !== undefined && !form) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  let response;
  try {
    response = await fetch(BASE + path, {
      method,
      headers,
      body: body === undefined || isForm ? body : JSON.stringify(body),
      body: body === undefined || form ? body : JSON.stringify(body),
      credentials: "same-origin",
    });
  } catch {
    throw new ApiError(0, "network_error", "Could not reach the server. Check your connection and try again.");
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    const retryAfter = Number.parseInt(response.headers.get("Retry-After") || "", 10);
    throw new ApiError(
      response.status,
      error.code || `http_${response.status}`,
      error.message || `The server answered ${response.status}. Please try again.`,
      error.detail ?? null,
      Number.isFinite(retryAfter) ? retryAfter : null,
    );
  }
  return data;
}

const id = (value) => encodeURIComponent(value);

export function listConversations({ q = "", cursor = null, archived = false } = {}) {
  const params = new URLSearchParams();
  if (q) params.set("q", q);
  if (cursor) params.set("cursor", cursor);
  if (archived) params.set("archived", "true");
  const query = params.toString();
  return request("GET", `conversations${query ? `?${query}` : ""}`);
}

export const createConversation = ({ model }) => request("POST", "conversations", { model });
export const getConversation = (conversationId) => request("GET", `conversations/${id(conversationId)}`);
export const renameConversation = (conversationId, title) =>
  request("PATCH", `conversations/${id(conversationId)}`, { title });
export const deleteConversation = (conversationId) => request("DELETE", `conversations/${id(conversationId)}`);

/** `attachmentIds`: files uploaded to the conversation (`uploadAttachment`), not yet sent. */
export const sendMessage = (conversationId, content, attachmentIds = []) =>
  request("POST", `conversations/${id(conversationId)}/messages`, {
    content,
    ...(attachmentIds.length ? { attachment_ids: attachmentIds } : {}),
  });
export const editMessage = (conversationId, messageId, content) =>
  request("POST", `conversations/${id(conversationId)}/messages/${id(messageId)}/edit`, { content });
export const regenerateMessage = (conversationId, messageId) =>
  request("POST", `conversations/${id(conversationId)}/messages/${id(messageId)}/regenerate`);
export const switchBranch = (conversationId, messageId) =>
  request("POST", `conversations/${id(conversationId)}/branch`, { message_id: messageId });

export const getGeneration = (generationId) => request("GET", `generations/${id(generationId)}`);
export const cancelGeneration = (generationId) => request("POST", `generations/${id(generationId)}/cancel`);

/**
 * Tell the server the page is going away while an answer is still written: a closed tab's
 * answer stops at once unless another tab reads it; a reloaded page's waits a moment for the
 * new page to read it again (the server knows a reload by the new page it just served). A
 * beacon, the one request a closing page may still send, sets no headers: the CSRF token goes
 * in the form body, where Django's check reads `csrfmiddlewaretoken`.
 */
export function leaveGeneration(generationId) {
  const body = new URLSearchParams({ csrfmiddlewaretoken: csrfToken(), leaving: "1", page: PAGE_ID });
  return navigator.sendBeacon(`${BASE}generations/${id(generationId)}/cancel`, body);
}

/** An answer's event stream, read as this page (`lastEventId`: resume after it). */
export function generationStreamUrl(generationId, lastEventId = null) {
  const query = new URLSearchParams({ page: PAGE_ID });
  if (lastEventId) query.set("last_event_id", lastEventId);
  return `${BASE}generations/${id(generationId)}/stream?${query}`;
}

export const getConversationTools = (conversationId) => request("GET", `conversations/${id(conversationId)}/tools`);
export const setConversationTools = (conversationId, switches) =>
  request("PATCH", `conversations/${id(conversationId)}/tools`, { tools: switches });

// Folders, pins, archive and message search (#18).
/** `changes`: any of {folder_id (null: no folder), pinned, archived}. */
export const organizeConversation = (conversationId, changes) =>
  request("PATCH", `conversations/${id(conversationId)}`, changes);
export const listFolders = () => request("GET", "folders");
export const createFolder = (name) => request("POST", "folders", { name });
export const renameFolder = (folderId, name) => request("PATCH", `folders/${id(folderId)}`, { name });
export const deleteFolder = (folderId) => request("DELETE", `folders/${id(folderId)}`);
export function searchMessages({ q, cursor = null }) {
  const params = new URLSearchParams({ q });
  if (cursor) params.set("cursor", cursor);
  return request("GET", `search?${params}`);
}

// Share links and feedback (#18).
export const shareConversation = (conversationId) =>
  request("POST", `conversations/${id(conversationId)}/shares`);
export const listShares = () => request("GET", "shares");
export const revokeShare = (shareId) => request("POST", `shares/${id(shareId)}/revoke`);
/** `feedback`: {rating: "up" | "down", reason?, comment?}. */
export const setFeedback = (conversationId, messageId, feedback) =>
  request("PUT", `conversations/${id(conversationId)}/messages/${id(messageId)}/feedback`, feedback);
export const removeFeedback = (conversationId, messageId) =>
  request("DELETE", `conversations/${id(conversationId)}/messages/${id(messageId)}/feedback`);
// Export and import (#18).
export const exportUrl = (conversationId, kind) =>
  `${BASE}conversations/${id(conversationId)}/export.${kind === "markdown" ? "md" : "json"}`;
export const ACCOUNT_EXPORT_URL = `${BASE}export`;
export function uploadImport(file) {
  const form = new FormData();
  form.append("file", file);
  return request("POST", "imports", form);
}
export const getImport = (jobId) => request("GET", `imports/${id(jobId)}`);
export const listImports = () => request("GET", "imports");
// Attachments (#18): a file goes to its conversation first, then a message carries its id.
export function uploadAttachment(conversationId, file) {
  const form = new FormData();
  form.append("file", file, file.name);
  return request("POST", `conversations/${id(conversationId)}/attachments`, form);
}
export const discardAttachment = (conversationId, attachmentId) =>
  request("DELETE", `conversations/${id(conversationId)}/attachments/${id(attachmentId)}`);
// Custom instructions and memory (#18).
export const getPersonalization = () => request("GET", "personalization");
/** `changes`: any of {instructions, memory_suggestions}. */
export const updatePersonalization = (changes) => request("PATCH", "personalization", changes);
export const listMemory = () => request("GET", "memory");
export const addMemoryFact = (text) => request("POST", "memory", { text });
export const editMemoryFact = (factId, text) => request("PATCH", `memory/${id(factId)}`, { text });
export const deleteMemoryFact = (factId) => request("DELETE", `memory/${id(factId)}`);
export const confirmMemorySuggestion = (factId) => request("POST", `memory/${id(factId)}/confirm`);
export const dismissMemorySuggestion = (factId) => request("POST", `memory/${id(factId)}/dismiss`);
