// One generation's Server-Sent Events, folded into the state the page shows.
//
// The browser's EventSource reconnects by itself after a network drop and sends
// Last-Event-ID, so the server resumes exactly after the last event we saw. Every event id is
// also checked here: a connection whose first event is not newer than what we hold is a replay
// from the start (the server serves a finished answer whole), so the text is rebuilt rather than
// appended twice; any other event we already hold is skipped. Text is never lost or repeated.

import { ApiError, generationStreamUrl, getGeneration } from "./api.js";

// The events of chatsite/stream_events.py, in its order (chatsite/tests/test_stream_events.py
// holds this list to it).
const EVENTS = [
  "meta",
  "queue",
  "delta",
  "restart",
  "retract",
  "tool_start",
  "tool_result",
  "tool_error",
  "tool_calls",
  "error",
  "done",
];
const MAX_RETRIES = 6;

/** Compare two stream entry ids ("<ms>-<seq>"): negative, zero or positive. */
export function compareEventIds(a, b) {
  const [aMs, aSeq] = a.split("-").map(BigInt);
  const [bMs, bSeq] = b.split("-").map(BigInt);
  if (aMs !== bMs) return aMs < bMs ? -1 : 1;
  if (aSeq !== bSeq) return aSeq < bSeq ? -1 : 1;
  return 0;
}

export class GenerationStream {
  constructor(generationId, messageId, conversationId) {
    this.generationId = generationId;
    this.messageId = messageId;
    this.conversationId = conversationId;
    this.text = "";
    // connecting -> queued -> running -> done
    this.phase = "connecting";
    this.status = null; // complete | cancelled | failed | rejected | lost, once done
    this.finishReason = null;
    this.position = null;
    this.highDemand = false;
    this.routeNotice = null; // set when the overload policy sent the answer to another model
    this.error = null; // {code, message}
    this.retracted = null; // {message} when moderation withdrew the text
    this.restarted = false;
    // The tool loop's steps: {id, name, arguments, state: running|ok|error, content, preface}.
    this.toolSteps = [];
    this.reconnecting = false;
    this.stopping = false;
    this.lastEventId = null;
    this.listeners = new Set();
    this.source = null;
    this.firstOfConnection = true;
    this.retries = 0;
    this.closed = false;
  }

  get done() {
    return this.phase === "done";
  }

  subscribe(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  notify() {
    for (const listener of [...this.listeners]) listener(this);
  }

  open() {
    if (this.closed) return;
    const url = generationStreamUrl(this.generationId, this.lastEventId);
    const source = new EventSource(url, { withCredentials: true });
    this.source = source;
    this.firstOfConnection = true;
    source.addEventListener("open", () => {
      this.firstOfConnection = true;
      if (this.reconnecting) {
        this.reconnecting = false;
        this.notify();
      }
    });
    for (const name of EVENTS) {
      source.addEventListener(name, (event) => this.handle(name, event));
    }
    source.addEventListener("error", () => this.onError(source));
  }

  close() {
    this.closed = true;
    if (this.source) this.source.close();
  }

  reset() {
    this.text = "";
    this.toolSteps = [];
    this.error = null;
    this.retracted = null;
    this.restarted = false;
    this.position = null;
    this.highDemand = false;
  }

  handle(name, event) {
    const id = event.lastEventId;
    if (id) {
      const seen = this.lastEventId !== null && compareEventIds(id, this.lastEventId) <= 0;
      if (this.firstOfConnection) {
        if (seen) this.reset();
      } else if (seen) {
        return;
      }
      this.firstOfConnection = false;
      this.lastEventId = id;
    }
    this.retries = 0;
    let data = {};
    try {
      data = JSON.parse(event.data);
    } catch {
      data = {};
    }
    this.apply(name, data);
    this.notify();
  }

  apply(name, data) {
    switch (name) {
      case "meta":
        if (data.status === "queued" && this.phase !== "running") this.phase = "queued";
        if (typeof data.notice === "string" && data.notice) this.routeNotice = data.notice;
        if (data.status === "running") {
          this.phase = "running";
          this.position = null;
          this.highDemand = false;
        }
        break;
      case "queue":
        if (this.phase !== "running") this.phase = "queued";
        this.position = Number.isInteger(data.position) ? data.position : null;
        this.highDemand = Boolean(data.high_demand);
        break;
      case "delta":
        this.phase = "running";
        this.position = null;
        if (!this.retracted) this.text += typeof data.text === "string" ? data.text : "";
        break;
      case "restart":
        this.text = "";
        this.restarted = true;
        this.retracted = null;
        break;
      case "retract":
        // Moderation withdrew the answer: drop its text, show the notice instead.
        this.text = "";
        this.retracted = {
          message: String(data.notice || data.message || ""),
          categories: Array.isArray(data.labels) ? data.labels.map(String) : [],
        };
        break;
      case "tool_start":
        // The model paused to call a tool: what it said so far belongs to this step.
        this.toolSteps.push({
          id: String(data.id || ""),
          name: String(data.name || ""),
          arguments: String(data.arguments || ""),
          state: "running",
          content: "",
          preface: this.text,
        });
        this.text = "";
        break;
      case "tool_result":
      case "tool_error": {
        const step = this.toolSteps.find((s) => s.id === String(data.id || ""));
        if (!step) break;
        if (name === "tool_result") {
          step.state = "ok";
          step.content = String(data.content || "") + (data.truncated ? "…" : "");
        } else {
          step.state = "error";
          step.content = `${String(data.code || "error")}: ${String(data.message || "")}`;
        }
        break;
      }
      case "tool_calls":
        // Calls for an API client to run itself: an answer on the page never ends at them.
        break;
      case "error":
        this.error = {
          code: String(data.code || "error"),
          message: String(data.message || "The answer failed."),
        };
        break;
      case "done":
        this.phase = "done";
        this.status = String(data.status || "complete");
        this.finishReason = data.finish_reason || null;
        this.reconnecting = false;
        this.close();
        break;
      default:
        break;
    }
  }

  onError(source) {
    if (this.closed || this.phase === "done") {
      source.close();
      return;
    }
    this.reconnecting = true;
    this.notify();
    // CONNECTING: the browser retries by itself with Last-Event-ID. CLOSED: it gave up (an
    // HTTP error rather than a network drop), so ask after the generation and try again.
    if (source.readyState === EventSource.CLOSED) this.retryLater();
  }

  retryLater() {
    if (this.retries >= MAX_RETRIES) {
      this.giveUp("stream_lost", "Lost the connection to this answer. Reload the page to try again.");
      return;
    }
    const delay = Math.min(1000 * 2 ** this.retries, 10000);
    this.retries += 1;
    setTimeout(async () => {
      if (this.closed) return;
      try {
        await getGeneration(this.generationId);
      } catch (error) {
        if (error instanceof ApiError && error.status === 404) {
          this.giveUp("not_found", "This answer no longer exists.");
        } else {
          this.retryLater();
        }
        return;
      }
      this.open();
    }, delay);
  }

  giveUp(code, message) {
    this.error = { code, message };
    this.phase = "done";
    this.status = "lost";
    this.reconnecting = false;
    this.close();
    this.notify();
  }
}
