// The web chat's state and wiring: which conversation is on screen, the streams of answers
// being written, the composer, routing (`/` new chat, `/c/<id>` a conversation) and keys.
//
// The server is the source of truth: after every change (send, edit, regenerate, branch switch)
// the page reads the conversation again and renders its active branch. An answer still queued
// or streaming in that branch gets a stream; streams live until their answer is done, even off
// screen, so leaving a conversation never abandons an answer.

import * as api from "./api.js";
import { showExport } from "./exporting.js";
import { AttachmentTray } from "./attachments.js";
import { isInProgress, messageElement, startEdit, updateAssistant, withToolSteps } from "./messages.js";
import { MessageSearch } from "./search.js";
import { ShareDialog } from "./shares.js";
import { displayTitle, Sidebar } from "./sidebar.js";
import { GenerationStream } from "./stream.js";
import { ToolsMenu } from "./tools.js";

const config = JSON.parse(document.getElementById("chat-config").textContent);
const byId = (id) => document.getElementById(id);
const ui = {
  chat: byId("chat"),
  title: byId("conversation-title"),
  modelName: byId("model-name"),
  modelChoice: byId("model-choice"),
  picker: byId("model-picker"),
  scroller: byId("messages"),
  list: byId("message-list"),
  empty: byId("empty-state"),
  banner: byId("banner"),
  bannerText: byId("banner-text"),
  bannerClose: byId("banner-close"),
  composer: byId("composer"),
  prompt: byId("prompt"),
  send: byId("send"),
  stop: byId("stop"),
  live: byId("live-status"),
  toggle: byId("toggle-sidebar"),
  closeSidebar: byId("close-sidebar"),
  backdrop: byId("sidebar-backdrop"),
  newChat: byId("new-chat"),
  shareOpen: byId("share-open"),
  tray: byId("attachment-tray"),
  attach: byId("attach"),
  attachInput: byId("attach-input"),
};

const FINAL_STATUS = { complete: "complete", cancelled: "cancelled" };

const state = {
  conversation: null, // the detail on screen; null for a new chat
  viewId: null, // the conversation on screen or being opened
  streams: new Map(), // generation id -> GenerationStream, until its answer is done
  pending: false, // a request that changes the conversation is in flight
  editing: false,
  stickToBottom: true,
  dirty: new Set(), // streams with news not yet drawn
  frame: 0,
};

// Routing

const pathFor = (id) => (id ? `/c/${encodeURIComponent(id)}` : "/");

function idFromPath(pathname) {
  const match = /^\/c\/([0-9a-f-]{36})\/?$/i.exec(pathname);
  return match ? match[1] : null;
}

function route({ push }) {
  const id = idFromPath(window.location.pathname);
  if (id) openConversation(id, { push });
  else showNewChat({ push });
}

// Banner and announcements

function showBanner(text, kind = "") {
  ui.bannerText.textContent = text;
  ui.banner.dataset.kind = kind;
  ui.banner.hidden = false;
}

function hideBanner() {
  ui.banner.hidden = true;
  ui.bannerText.textContent = "";
}

function showError(error) {
  if (error && (error.code === "not_authenticated" || error.status === 401)) {
    window.location.assign(`${config.loginUrl}?next=${encodeURIComponent(window.location.pathname)}`);
    return;
  }
  let text = (error && error.message) || "Something went wrong. Please try again.";
  if (error && error.status === 429 && error.retryAfter) text += ` Try again in ${error.retryAfter} s.`;
  // Moderation: a refused message, or an account that may not send at all.
  const moderation = new Set(["content_blocked", "account_suspended", "account_banned"]);
  showBanner(text, error && moderation.has(error.code) ? error.code : "");
}

function announce(text) {
  ui.live.textContent = text;
}

// Views

function setHeader(conversation) {
  const title = conversation ? displayTitle(conversation) : "New chat";
  ui.title.textContent = title;
  document.title = `${conversation ? `${title} · ` : ""}Chatsite`;
  ui.modelName.textContent = conversation ? conversation.model : "";
  ui.modelName.hidden = !conversation;
  ui.modelChoice.hidden = Boolean(conversation);
  ui.shareOpen.hidden = !conversation;
  showExport(conversation);
}

function showNewChat({ push }) {
  state.conversation = null;
  state.viewId = null;
  state.editing = false;
  if (push) window.history.pushState(null, "", pathFor(null));
  setHeader(null);
  tools.show(null);
  tray.reset(null);
  ui.list.replaceChildren();
  ui.empty.hidden = false;
  sidebar.setActive(null);
  hideBanner();
  closeSidebar();
  updateComposer();
  ui.prompt.focus();
}

async function openConversation(id, { push }) {
  state.viewId = id;
  let detail;
  try {
    detail = await api.getConversation(id);
  } catch (error) {
    if (state.viewId !== id) return;
    if (error.status === 404) {
      window.history.replaceState(null, "", pathFor(null));
      showNewChat({ push: false });
      showBanner("That conversation does not exist or was deleted.");
    } else {
      showError(error);
    }
    return;
  }
  if (state.viewId !== id) return;
  if (push) window.history.pushState(null, "", pathFor(id));
  hideBanner();
  closeSidebar();
  showConversation(detail, { scroll: "bottom" });
  ui.prompt.focus();
}

/** Open a search result (#18): its conversation on the branch that holds the message,
 * scrolled to it and marked. */
async function openMessage(id, messageId) {
  state.viewId = id;
  let detail;
  try {
    detail = await api.switchBranch(id, messageId);
  } catch (error) {
    if (state.viewId === id) showError(error);
    return;
  }
  if (state.viewId !== id) return;
  if (window.location.pathname !== pathFor(id)) window.history.pushState(null, "", pathFor(id));
  hideBanner();
  closeSidebar();
  showConversation(detail, { scroll: "none" });
  const item = elementFor(messageId);
  if (!item) return;
  item.classList.add("search-hit");
  item.tabIndex = -1;
  item.scrollIntoView({ block: "center" });
  item.focus({ preventScroll: true });
}

/** Read the conversation again and show it, if it is still the one on screen. */
async function reload(id, options = {}) {
  const detail = await api.getConversation(id);
  if (state.viewId === id) showConversation(detail, options);
  return detail;
}

function showConversation(detail, { scroll = "bottom" } = {}) {
  const opened = state.conversation?.id !== detail.id;
  state.conversation = detail;
  state.viewId = detail.id;
  state.editing = false;
  setHeader(detail);
  if (opened) {
    tools.show(detail.id);
    tray.reset(detail.id);
  }
  sidebar.setActive(detail.id);
  for (const message of detail.messages) {
    if (isInProgress(message)) ensureStream(message.generation_id, message.id, detail.id);
  }
  renderMessages();
  updateComposer();
  if (scroll === "bottom") scrollToBottom(true);
  loadErrors(detail);
}

function visibleMessages() {
  return state.conversation ? withToolSteps(state.conversation.messages) : [];
}

function contextFor(message) {
  return {
    stream: isInProgress(message) ? state.streams.get(message.generation_id) : null,
    busy: isBusy(),
    switching: state.pending,
    onEdit,
    onRegenerate,
    onSwitch,
    onFeedback,
    feedbackReasons: config.feedbackReasons,
  };
}

function renderMessages() {
  const messages = visibleMessages();
  ui.list.replaceChildren(...messages.map((message) => messageElement(message, contextFor(message))));
  ui.empty.hidden = messages.length > 0;
}

function elementFor(messageId) {
  return ui.list.querySelector(`[data-message-id="${CSS.escape(messageId)}"]`);
}

/** The reason of a failed answer is on its generation; fetch it for the failed ones shown. */
async function loadErrors(detail) {
  for (const message of detail.messages) {
    if (message.role !== "assistant" || message.status !== "failed" || message.error || !message.generation_id) continue;
    try {
      const generation = await api.getGeneration(message.generation_id);
      if (generation.error_message) message.error = { code: generation.error_code, message: generation.error_message };
    } catch {
      continue;
    }
    const item = state.conversation === detail ? elementFor(message.id) : null;
    if (item) updateAssistant(item, message, contextFor(message));
  }
}

function scrollToBottom(force = false) {
  if (force || state.stickToBottom) ui.scroller.scrollTop = ui.scroller.scrollHeight;
}

// Streams

function ensureStream(generationId, messageId, conversationId) {
  let stream = state.streams.get(generationId);
  if (!stream) {
    stream = new GenerationStream(generationId, messageId, conversationId);
    stream.subscribe(onStreamNews);
    state.streams.set(generationId, stream);
    stream.open();
  }
  return stream;
}

function onStreamNews(stream) {
  state.dirty.add(stream);
  if (!state.frame) state.frame = window.requestAnimationFrame(drawStreams);
}

function drawStreams() {
  state.frame = 0;
  const streams = [...state.dirty];
  state.dirty.clear();
  for (const stream of streams) {
    const message = findMessage(stream.messageId);
    const item = message ? elementFor(message.id) : null;
    if (item) updateAssistant(item, message, contextFor(message));
    if (stream.done) finishStream(stream, message);
    else if (message) announcePhase(stream);
  }
  scrollToBottom();
  updateComposer();
}

function findMessage(messageId) {
  return state.conversation ? state.conversation.messages.find((m) => m.id === messageId) : null;
}

function announcePhase(stream) {
  const key = `${stream.phase}:${stream.position}:${stream.highDemand}`;
  if (stream.announced === key) return;
  stream.announced = key;
  if (stream.phase === "queued" && stream.position) {
    announce(`Your answer will start shortly (position ${stream.position}).`);
  } else if (stream.phase === "running" && !stream.text) {
    announce("The answer is being written.");
  }
}

function finishStream(stream, message) {
  state.streams.delete(stream.generationId);
  if (message) {
    message.status = stream.retracted ? "blocked" : FINAL_STATUS[stream.status] || "failed";
    message.content = stream.text;
    if (stream.retracted) message.notice = stream.retracted.message;
    if (stream.toolSteps.length) message.streamToolSteps = stream.toolSteps;
    message.error = stream.error;
    message.finishReason = stream.finishReason;
    const focused = document.activeElement;
    renderMessages();
    if (!focused || !document.body.contains(focused)) ui.prompt.focus();
    const words = { complete: "Answer complete.", cancelled: "Answer stopped." };
    announce(words[stream.status] || "The answer failed.");
  }
  sidebar.refreshTop();
}

/** The answer being written in the conversation on screen, if any. */
function activeStream() {
  if (!state.conversation) return null;
  for (const message of state.conversation.messages) {
    if (!isInProgress(message)) continue;
    const stream = state.streams.get(message.generation_id);
    if (stream && !stream.done) return stream;
  }
  return null;
}

const isBusy = () => state.pending || activeStream() !== null;

// Composer

function updateComposer() {
  const generating = activeStream() !== null;
  ui.send.hidden = generating;
  ui.stop.hidden = !generating;
  ui.send.disabled = state.pending;
  const canWrite = Boolean(state.conversation) || config.models.length > 0;
  ui.prompt.disabled = !canWrite;
  ui.attach.disabled = !canWrite;
  ui.composer.classList.toggle("busy", state.pending);
}

function autosize() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight, window.innerHeight * 0.4)}px`;
}

function tooLong(content) {
  if (content.length <= config.messageMaxChars) return false;
  showBanner(`A message may hold at most ${config.messageMaxChars} characters; this one has ${content.length}.`);
  return true;
}

function pendingUserMessage(content) {
  const item = document.createElement("li");
  item.className = "message user pending";
  const role = document.createElement("div");
  role.className = "message-role";
  role.textContent = "You";
  const body = document.createElement("div");
  body.className = "message-body";
  body.textContent = content;
  item.append(role, body);
  ui.list.append(item);
  ui.empty.hidden = true;
  scrollToBottom(true);
  return item;
}

async function submitPrompt() {
  const content = ui.prompt.value;
  if (!content.trim() || state.pending) return;
  if (activeStream()) {
    showBanner("An answer is still being written. Wait for it, or stop it first.");
    return;
  }
  if (tooLong(content)) return;
  hideBanner();
  state.pending = true;
  updateComposer();
  const pending = pendingUserMessage(content);
  try {
    let conversation = state.conversation;
    if (!conversation) {
      const model = ui.picker ? ui.picker.value : config.defaultModel;
      conversation = await api.createConversation({ model });
      state.conversation = conversation;
      state.viewId = conversation.id;
      window.history.pushState(null, "", pathFor(conversation.id));
      setHeader(conversation);
      sidebar.upsert(conversation, { top: true });
      sidebar.setActive(conversation.id);
    }
    // The files chosen go first (a new chat's now that it exists); a refused one stops the send.
    const attachmentIds = tray.isEmpty ? [] : await tray.ready(conversation.id);
    const turn = await api.sendMessage(conversation.id, content, attachmentIds);
    tray.sent();
    ui.prompt.value = "";
    autosize();
    ensureStream(turn.generation.id, turn.assistant_message.id, conversation.id);
    state.pending = false;
    await reload(conversation.id);
    sidebar.refreshTop();
  } catch (error) {
    pending.remove();
    ui.empty.hidden = visibleMessages().length > 0;
    showError(error);
  } finally {
    state.pending = false;
    updateComposer();
  }
}

/** Run a change that starts a new answer (edit, regenerate), then show the result. */
async function change(run) {
  if (!state.conversation || state.pending) return;
  const id = state.conversation.id;
  hideBanner();
  state.pending = true;
  updateComposer();
  try {
    const turn = await run(id);
    ensureStream(turn.generation.id, turn.assistant_message.id, id);
    state.pending = false;
    await reload(id);
    sidebar.refreshTop();
  } catch (error) {
    showError(error);
  } finally {
    state.pending = false;
    updateComposer();
  }
}

function onEdit(message, item) {
  if (isBusy() || state.editing) return;
  state.editing = true;
  startEdit(item, message, {
    onSubmit: (content) => {
      if (!tooLong(content)) change((id) => api.editMessage(id, message.id, content));
    },
    onCancel: () => {
      state.editing = false;
    },
  });
}

function onRegenerate(message) {
  if (isBusy()) return;
  change((id) => api.regenerateMessage(id, message.id));
}

async function onSwitch(message, siblingId) {
  if (!state.conversation || state.pending || !siblingId) return;
  const id = state.conversation.id;
  const forward = message.sibling_ids.indexOf(siblingId) > message.sibling_ids.indexOf(message.id);
  state.pending = true;
  try {
    const detail = await api.switchBranch(id, siblingId);
    if (state.viewId !== id) return;
    state.pending = false;
    showConversation(detail, { scroll: "keep" });
    // Keep the keyboard where it was: on the same switcher, now of the sibling.
    const item = elementFor(siblingId);
    const target = item && item.querySelector(`.branch-step[aria-label="${forward ? "Next" : "Previous"} version"]`);
    const fallback = item && item.querySelector(".branch-step:not([disabled])");
    const focus = target && !target.disabled ? target : fallback;
    if (focus) focus.focus();
  } catch (error) {
    showError(error);
  } finally {
    state.pending = false;
    updateComposer();
  }
}

/** Save the user's thumbs on an answer (#18); null takes them back. Resolves to what is now
 * saved, or undefined when it failed (the error is shown). */
async function onFeedback(message, feedback) {
  const id = state.conversation?.id;
  if (!id) return undefined;
  try {
    if (feedback === null) {
      await api.removeFeedback(id, message.id);
      return null;
    }
    const saved = await api.setFeedback(id, message.id, feedback);
    return { rating: saved.rating, reason: saved.reason, comment: saved.comment };
  } catch (error) {
    showError(error);
    return undefined;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function stopAnswer() {
  const stream = activeStream();
  if (!stream || stream.stopping) return;
  stream.stopping = true;
  stream.notify();
  // The cancel reaches the answer through whichever scheduler runs it; while the answer
  // runs on, ask again (cancelling twice is harmless).
  for (let attempt = 0; attempt < 5 && !stream.done; attempt += 1) {
    try {
      await api.cancelGeneration(stream.generationId);
    } catch (error) {
      stream.stopping = false;
      stream.notify();
      showError(error);
      return;
    }
    await sleep(3000);
  }
}

// The sidebar on small screens

function openSidebar() {
  ui.chat.classList.add("sidebar-open");
  ui.toggle.setAttribute("aria-expanded", "true");
  ui.backdrop.hidden = false;
  byId("search").focus();
}

function closeSidebar() {
  if (!ui.chat.classList.contains("sidebar-open")) return;
  ui.chat.classList.remove("sidebar-open");
  ui.toggle.setAttribute("aria-expanded", "false");
  ui.backdrop.hidden = true;
}

// Wiring

const tray = new AttachmentTray({ list: ui.tray, input: ui.attachInput, button: ui.attach });

const tools = new ToolsMenu({
  root: byId("tools-menu"),
  list: byId("tools-list"),
  note: byId("tools-note"),
});

const sidebarHandlers = {
  onOpen: (id) => openConversation(id, { push: true }),
  onDeleted: (id) => {
    // Its answers were stopped with it; stop listening to them too.
    for (const stream of state.streams.values()) {
      if (stream.conversationId === id) {
        stream.close();
        state.streams.delete(stream.generationId);
      }
    }
    if (state.viewId === id) showNewChat({ push: true });
  },
  onChanged: (conversation) => {
    if (state.conversation && state.conversation.id === conversation.id) {
      state.conversation.title = conversation.title;
      setHeader(state.conversation);
    }
  },
  onError: showError,
};
const sidebar = new Sidebar(sidebarHandlers);
new MessageSearch({ onOpenMessage: openMessage, onError: showError });
// The conversation on screen, or the one the page was opened at while it is still loading: a
// Share clicked on a page served for /c/<id> before its messages arrive shares that one.
new ShareDialog({ conversationId: () => state.conversation?.id ?? state.viewId ?? null });

// Events of this user from the server (titles written in the background, deletions made in
// another tab or by history retention). EventSource reconnects by itself with Last-Event-ID.
function listenToUserEvents() {
  const source = new EventSource("/api/v1/events/stream");
  source.addEventListener("title", (event) => {
    const { conversation_id: id, title } = JSON.parse(event.data);
    const conversation = sidebar.applyTitle(id, title);
    if (conversation) sidebarHandlers.onChanged(conversation);
    else if (state.conversation && state.conversation.id === id && !state.conversation.title) {
      sidebarHandlers.onChanged({ id, title });
    }
  });
  // An import finished (#18), here or in another tab: its conversations join the sidebar.
  source.addEventListener("imported", () => sidebar.reload());
  source.addEventListener("deleted", (event) => {
    const { conversation_id: id } = JSON.parse(event.data);
    if (!sidebar.items.has(id) && state.viewId !== id) return;
    sidebar.remove(id);
    sidebarHandlers.onDeleted(id);
  });
}

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  submitPrompt();
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    submitPrompt();
  }
});
ui.prompt.addEventListener("input", autosize);
ui.stop.addEventListener("click", stopAnswer);
ui.bannerClose.addEventListener("click", hideBanner);
ui.toggle.addEventListener("click", () => {
  if (ui.chat.classList.contains("sidebar-open")) closeSidebar();
  else openSidebar();
});
ui.closeSidebar.addEventListener("click", () => {
  closeSidebar();
  ui.toggle.focus();
});
ui.backdrop.addEventListener("click", closeSidebar);
ui.newChat.addEventListener("click", (event) => {
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  showNewChat({ push: true });
});
ui.scroller.addEventListener("scroll", () => {
  const gap = ui.scroller.scrollHeight - ui.scroller.scrollTop - ui.scroller.clientHeight;
  state.stickToBottom = gap < 80;
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape" || event.defaultPrevented) return;
  if (ui.chat.classList.contains("sidebar-open")) {
    closeSidebar();
    ui.toggle.focus();
  } else if (!state.editing) {
    stopAnswer();
  }
});
window.addEventListener("popstate", () => route({ push: false }));
// Closing the tab stops the answers still being written, wherever they are shown, unless
// another tab reads them; a reload keeps them (the server knows a reload by the page it just
// served, and waits a moment for the new page to read them again).
window.addEventListener("pagehide", () => {
  for (const stream of state.streams.values()) {
    if (!stream.done) api.leaveGeneration(stream.generationId);
  }
});

sidebar.reload();
route({ push: false });
listenToUserEvents();
