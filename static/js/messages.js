// The message list: one element per message on the active branch, with its actions, its
// branch switcher (`< 2/3 >`) and, for an answer, its state (queued, streaming, stopped...).
// User text is only ever set as text; answers go through the Markdown module.

import { attachmentList } from "./attachments.js";
import { copyButton, renderMarkdown } from "./markdown.js";

const IN_PROGRESS = new Set(["queued", "streaming"]);

export const isInProgress = (message) =>
  message.role === "assistant" && IN_PROGRESS.has(message.status) && Boolean(message.generation_id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(text, label, onClick, className = "action") {
  const node = element("button", className, text);
  node.type = "button";
  node.setAttribute("aria-label", label);
  node.addEventListener("click", onClick);
  return node;
}

/**
 * The tool loop writes each round (the assistant's calls, then one `tool` message per result)
 * between a question and its answer. Those rows are not shown as messages: their calls and
 * results become `tool_steps` of the answer they led to. Returns the messages to show.
 */
export function withToolSteps(messages) {
  const shown = [];
  let steps = [];
  let head = null; // the round's first row: the other versions of the answer are its siblings
  for (const message of messages) {
    if (message.role === "assistant" && Array.isArray(message.tool_calls) && message.tool_calls.length) {
      head = head || message;
      message.tool_calls.forEach((call, index) => {
        steps.push({
          id: String(call.id),
          name: String(call.name),
          arguments: String(call.arguments),
          state: "running",
          content: "",
          preface: index === 0 ? message.content : "",
        });
      });
    } else if (message.role === "tool") {
      const step = message.tool && steps.find((s) => s.id === message.tool.call_id);
      if (step) {
        step.state = message.tool.ok ? "ok" : "error";
        step.content = message.content;
      }
    } else {
      if (message.role === "assistant") {
        // An answer just finished on this page has its steps from its stream until re-read.
        message.tool_steps = steps.length ? steps : message.streamToolSteps || [];
        if (head && head.sibling_count > 1) {
          message.sibling_index = head.sibling_index;
          message.sibling_count = head.sibling_count;
          message.sibling_ids = head.sibling_ids;
        }
        steps = [];
        head = null;
      }
      if (message.role === "user" || message.role === "assistant") shown.push(message);
    }
  }
  return shown;
}

function mergedSteps(stored, live) {
  const known = new Set(live.map((step) => step.id));
  return [...(stored || []).filter((step) => !known.has(step.id)), ...live];
}

/** What an answer shows: from its stream while one is attached, else from the message. */
export function assistantView(message, stream) {
  if (!stream) {
    return {
      toolSteps: message.tool_steps || [],
      text: message.content,
      status: message.status,
      position: null,
      highDemand: false,
      routeNotice: (message.route && message.route.notice) || null,
      error: message.error || null,
      restarted: false,
      reconnecting: false,
      stopping: false,
      finishReason: message.finishReason || null,
      started: message.content.length > 0,
      retracted: message.status === "blocked" ? { message: message.notice || "" } : null,
    };
  }
  let status;
  if (stream.done && stream.retracted) {
    status = "blocked";
  } else if (stream.done) {
    status = { complete: "complete", cancelled: "cancelled", lost: "lost" }[stream.status] || "failed";
  } else {
    status = stream.phase === "running" ? "streaming" : "queued";
  }
  return {
    toolSteps: mergedSteps(message.tool_steps, stream.toolSteps),
    text: stream.text,
    status,
    position: stream.position,
    highDemand: stream.highDemand,
    routeNotice: stream.routeNotice || (message.route && message.route.notice) || null,
    error: stream.error,
    retracted: stream.retracted,
    restarted: stream.restarted,
    reconnecting: stream.reconnecting,
    stopping: stream.stopping,
    finishReason: stream.finishReason,
    started: stream.phase === "running" || stream.text.length > 0,
  };
}

function stateText(view) {
  if (view.stopping && IN_PROGRESS.has(view.status)) return ["stopping", "Stopping…"];
  if (view.reconnecting) return ["reconnecting", "Connection lost. Reconnecting…"];
  switch (view.status) {
    case "queued":
      if (view.routeNotice) {
        const where = view.position ? ` (position ${view.position})` : "";
        return ["high-demand", `${view.routeNotice} It starts shortly${where}.`];
      }
      if (view.highDemand) {
        const where = view.position ? ` (position ${view.position})` : "";
        return ["high-demand", `High demand right now: your answer is waiting for a free model${where}.`];
      }
      if (view.position) return ["queued", `Your answer will start shortly (position ${view.position}).`];
      return ["queued", "Your answer will start shortly."];
    case "streaming":
      if (view.restarted && !view.text) return ["restarted", "A model worker failed; starting the answer again…"];
      if (!view.text && view.toolSteps.some((step) => step.state === "running")) return ["tool", "Using a tool…"];
      return view.text ? ["streaming", ""] : ["thinking", "Thinking…"];
    case "cancelled":
      return ["cancelled", view.text ? "Stopped." : "Stopped before the answer started."];
    case "failed":
      return ["failed", (view.error && view.error.message) || "The answer failed. Try Regenerate."];
    case "lost":
      return ["failed", (view.error && view.error.message) || "Lost the connection to this answer."];
    case "blocked":
      return ["blocked", (view.retracted && view.retracted.message) || "This answer was withheld by moderation."];
    case "complete":
      if (view.retracted) return ["blocked", view.retracted.message || "This answer was withdrawn by moderation."];
      if (view.finishReason === "length") return ["note", "The answer reached its length limit."];
      return ["complete", ""];
    default:
      return ["", ""];
  }
}

function branchSwitcher(message, onSwitch, disabled) {
  if (!message.sibling_count || message.sibling_count < 2) return null;
  const index = message.sibling_index;
  const count = message.sibling_count;
  const group = element("div", "branch");
  group.setAttribute("role", "group");
  group.setAttribute("aria-label", `Version ${index} of ${count}`);
  const previous = button("‹", "Previous version", () => onSwitch(message, message.sibling_ids[index - 2]), "branch-step");
  previous.disabled = disabled || index <= 1;
  const next = button("›", "Next version", () => onSwitch(message, message.sibling_ids[index]), "branch-step");
  next.disabled = disabled || index >= count;
  const where = element("span", "branch-position", `${index}/${count}`);
  group.append(previous, where, next);
  return group;
}

/**
 * One message as a list item. `context`: {stream, busy, onEdit, onRegenerate, onSwitch}.
 * Answers are filled by `updateAssistant`.
 */
export function messageElement(message, context) {
  const item = element("li", `message ${message.role}`);
  item.dataset.messageId = message.id;
  const role = element("div", "message-role", message.role === "user" ? "You" : "Assistant");
  const body = element("div", "message-body");
  item.append(role, body);
  if (message.role === "user") {
    body.textContent = message.content;
    const files = attachmentList(message.attachments);
    if (files) item.append(files);
    const actions = element("div", "message-actions");
    const switcher = branchSwitcher(message, context.onSwitch, context.switching);
    if (switcher) actions.append(switcher);
    actions.append(copyButton(() => message.content, "Copy your message"));
    const edit = button("Edit", "Edit this message", () => context.onEdit(message, item));
    edit.disabled = context.busy;
    actions.append(edit);
    item.append(actions);
  } else {
    body.classList.add("markdown");
    body.before(element("div", "tool-steps"));
    const state = element("p", "message-state");
    const actions = element("div", "message-actions");
    item.append(state, actions);
    updateAssistant(item, message, context);
  }
  return item;
}

const STEP_STATE = { running: "running…", ok: "done", error: "failed" };

function toolStepElement(step, open) {
  const details = element("details", "tool-step");
  details.dataset.state = step.state;
  details.dataset.callId = step.id;
  details.open = open;
  const summary = element("summary", "tool-step-summary");
  summary.append(element("span", "tool-step-label", "Tool"), " ", element("code", "tool-step-name", step.name), " ");
  summary.append(element("span", "tool-step-state", STEP_STATE[step.state] || step.state));
  details.append(summary);
  if (step.preface) details.append(element("p", "tool-step-preface", step.preface));
  details.append(element("div", "tool-step-heading", "Arguments"), element("pre", "tool-step-arguments", step.arguments));
  if (step.state !== "running") {
    details.append(
      element("div", "tool-step-heading", step.state === "error" ? "Error" : "Result"),
      element("pre", "tool-step-output", step.content),
    );
  }
  return details;
}

/** Tool calls and their results as collapsible steps; tool output is only ever text. */
function renderToolSteps(container, steps) {
  const signature = JSON.stringify(steps);
  if (container.dataset.rendered === signature) return;
  const open = new Set([...container.querySelectorAll("details[open]")].map((node) => node.dataset.callId));
  container.replaceChildren(...steps.map((step) => toolStepElement(step, open.has(step.id))));
  container.dataset.rendered = signature;
  container.hidden = steps.length === 0;
}

/** Refresh an answer's text, state line and actions from its message and stream. */
export function updateAssistant(item, message, context) {
  const view = assistantView(message, context.stream);
  renderToolSteps(item.querySelector(".tool-steps"), view.toolSteps);
  const body = item.querySelector(".message-body");
  if (body.dataset.rendered !== view.text || !body.hasChildNodes()) {
    renderMarkdown(body, view.text);
    body.dataset.rendered = view.text;
  }
  item.dataset.status = view.status;
  item.setAttribute("aria-busy", String(IN_PROGRESS.has(view.status)));
  let [kind, text] = stateText(view);
  // An answer another model wrote says so once nothing else needs saying.
  if (!text && view.routeNotice) [kind, text] = ["note", view.routeNotice];
  const state = item.querySelector(".message-state");
  state.dataset.kind = kind;
  state.textContent = text;
  state.hidden = !text;

  const actions = item.querySelector(".message-actions");
  actions.replaceChildren();
  const switcher = branchSwitcher(message, context.onSwitch, context.switching);
  if (switcher) actions.append(switcher);
  const finished = !IN_PROGRESS.has(view.status);
  if (finished && view.text) actions.append(copyButton(() => view.text, "Copy the answer"));
  if (finished) {
    const regenerate = button("Regenerate", "Regenerate this answer", () => context.onRegenerate(message));
    regenerate.disabled = context.busy;
    if (view.status === "failed" || view.status === "lost") regenerate.classList.add("primary");
    actions.append(regenerate);
  }
  if (context.onFeedback && FEEDBACK_STATUSES.has(view.status) && view.text && !context.stream) {
    actions.append(feedbackButtons(item, message, context));
  }
}

// Feedback (#18): thumbs up or down under a finished answer, the chosen one pressed; a thumbs
// down asks for an optional reason. `context.onFeedback(message, feedback)` saves it (null
// takes it back) and resolves to the saved feedback; the answer is then drawn again.
const FEEDBACK_STATUSES = new Set(["complete", "cancelled"]);
const SVG = "http://www.w3.org/2000/svg";
const THUMBS = {
  up: "M14 9V5a3 3 0 0 0-3-3l-4 9v11h11.28a2 2 0 0 0 2-1.7l1.38-9a2 2 0 0 0-2-2.3zM7 22H4a2 2 0 0 1-2-2v-7a2 2 0 0 1 2-2h3",
  down: "M10 15v4a3 3 0 0 0 3 3l4-9V2H5.72a2 2 0 0 0-2 1.7l-1.38 9a2 2 0 0 0 2 2.3zm7-13h2.67A2.31 2.31 0 0 1 22 4v7a2.31 2.31 0 0 1-2.33 2H17",
};

function thumb(direction, label, onClick) {
  const node = button("", label, onClick, "action thumb");
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", THUMBS[direction]);
  svg.append(path);
  node.append(svg);
  return node;
}

function feedbackButtons(item, message, context) {
  const group = element("div", "feedback");
  group.setAttribute("role", "group");
  group.setAttribute("aria-label", "Rate this answer");
  const rating = message.feedback ? message.feedback.rating : null;
  const save = async (feedback) => {
    closeReasonForm(item);
    const saved = await context.onFeedback(message, feedback);
    if (saved === undefined) return;
    message.feedback = saved;
    updateAssistant(item, message, context);
  };
  const up = thumb("up", "Good answer", () => save(rating === "up" ? null : { rating: "up" }));
  up.setAttribute("aria-pressed", String(rating === "up"));
  const down = thumb("down", "Bad answer", () => {
    if (rating === "down") save(null);
    else openReasonForm(item, message, context, save);
  });
  down.setAttribute("aria-pressed", String(rating === "down"));
  group.append(up, down);
  if (rating === "down" && message.feedback.reason) {
    const label = (context.feedbackReasons || []).find(([value]) => value === message.feedback.reason);
    group.append(element("span", "feedback-reason-chosen", label ? label[1] : message.feedback.reason));
  }
  return group;
}

function closeReasonForm(item) {
  const form = item.querySelector(".feedback-form");
  if (form) form.remove();
}

function openReasonForm(item, message, context, save) {
  closeReasonForm(item);
  const form = element("form", "feedback-form");
  form.setAttribute("aria-label", "What was wrong with this answer?");
  const legend = element("p", "feedback-form-title", "What was wrong with this answer? (optional)");
  const reasonLabel = element("label", "visually-hidden", "Reason");
  const reason = element("select", "feedback-reason");
  reason.id = `feedback-reason-${message.id}`;
  reasonLabel.htmlFor = reason.id;
  reason.append(new Option("No reason", ""));
  for (const [value, label] of context.feedbackReasons || []) reason.append(new Option(label, value));
  const commentLabel = element("label", "visually-hidden", "Comment");
  const comment = element("input", "feedback-comment");
  comment.id = `feedback-comment-${message.id}`;
  commentLabel.htmlFor = comment.id;
  comment.type = "text";
  comment.maxLength = 500;
  comment.placeholder = "Anything to add? (optional)";
  const send = element("button", "primary", "Send feedback");
  send.type = "submit";
  const cancel = button("Cancel", "Cancel the feedback", () => closeReasonForm(item), "action");
  const row = element("div", "edit-actions");
  row.append(cancel, send);
  form.append(legend, reasonLabel, reason, commentLabel, comment, row);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    save({ rating: "down", reason: reason.value, comment: comment.value });
  });
  form.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    event.preventDefault();
    event.stopPropagation();
    closeReasonForm(item);
  });
  item.querySelector(".message-actions").after(form);
  reason.focus();
}

/** Swap a user message's text for an edit box; `onSubmit(text)` sends the edit. */
export function startEdit(item, message, { onSubmit, onCancel }) {
  const body = item.querySelector(".message-body");
  const actions = item.querySelector(".message-actions");
  const form = element("form", "edit-form");
  const label = element("label", "visually-hidden", "Edit your message");
  const area = element("textarea", "edit-box");
  area.id = `edit-${message.id}`;
  label.htmlFor = area.id;
  area.value = message.content;
  area.rows = Math.min(12, Math.max(2, message.content.split("\n").length));
  const save = element("button", "primary", "Send");
  save.type = "submit";
  save.setAttribute("aria-label", "Send the edited message");
  const cancel = button("Cancel", "Cancel the edit", () => finish(), "action");
  const row = element("div", "edit-actions");
  row.append(cancel, save);
  form.append(label, area, row);

  function finish() {
    form.remove();
    body.hidden = false;
    actions.hidden = false;
    onCancel();
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (area.value.trim()) onSubmit(area.value);
  });
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation();
      finish();
    } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  body.hidden = true;
  actions.hidden = true;
  body.after(form);
  area.focus();
  area.setSelectionRange(area.value.length, area.value.length);
}
