// The "Your data" page (#18): an import's upload, then its progress, polled until it ends;
// the list of recent imports. Every text is set with textContent.

import * as api from "./api.js";

const config = JSON.parse(document.getElementById("data-config").textContent);
const byId = (id) => document.getElementById(id);
const ui = {
  form: byId("import-form"),
  file: byId("import-file"),
  submit: byId("import-submit"),
  state: byId("import-state"),
  progress: byId("import-progress"),
  status: byId("import-status"),
  error: byId("import-error"),
  done: byId("import-done"),
  list: byId("import-list"),
};

const POLL_MS = 500;
const FINAL = new Set(["done", "failed"]);
let following = false; // an import's progress is on screen
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function describe(job) {
  switch (job.status) {
    case "queued":
      return "Waiting to start…";
    case "validating":
      return `Checking the file… ${plural(job.done, "conversation")} read`;
    case "importing":
      return `Importing ${job.done} of ${plural(job.total, "conversation")}…`;
    case "done":
      return `Imported ${plural(job.imported, "conversation")}.`;
    default:
      return "The import failed: nothing was imported.";
  }
}

function showJob(job) {
  ui.state.hidden = false;
  ui.status.textContent = describe(job);
  if (job.status === "importing" || job.status === "done") {
    ui.progress.max = Math.max(job.total || 0, 1);
    ui.progress.value = job.status === "done" ? ui.progress.max : job.done;
  } else {
    ui.progress.removeAttribute("value"); // indeterminate while the file is read
  }
  ui.progress.hidden = job.status === "failed";
  ui.error.hidden = job.status !== "failed";
  ui.error.textContent = job.error ? job.error.message : "";
  ui.done.hidden = job.status !== "done";
}

function showError(message) {
  ui.state.hidden = false;
  ui.progress.hidden = true;
  ui.done.hidden = true;
  ui.status.textContent = "";
  ui.error.hidden = false;
  ui.error.textContent = message;
}

async function follow(jobId) {
  following = true;
  try {
    await poll(jobId);
  } finally {
    following = false;
  }
}

async function poll(jobId) {
  for (;;) {
    let job;
    try {
      job = await api.getImport(jobId);
    } catch (error) {
      showError(error.message);
      return;
    }
    showJob(job);
    if (FINAL.has(job.status)) return;
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

async function refreshList() {
  let page;
  try {
    page = await api.listImports();
  } catch {
    return;
  }
  ui.list.replaceChildren(
    ...page.results.map((job) => {
      const item = document.createElement("li");
      const when = new Date(job.created_at).toLocaleString();
      item.textContent = `${job.filename || "file"} · ${when} · ${describe(job)}`;
      if (job.error) item.textContent += ` ${job.error.message}`;
      return item;
    }),
  );
  // An import still running when the page was opened (a reload, another tab): follow it.
  const latest = page.results[0];
  if (latest && !FINAL.has(latest.status) && !following) {
    await follow(latest.id);
    refreshList();
  }
}

ui.form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const file = ui.file.files[0];
  if (!file) return;
  if (file.size > config.importMaxBytes) {
    showError(`The file is too large: an import takes at most ${Math.floor(config.importMaxBytes / 1048576)} MB.`);
    return;
  }
  ui.submit.disabled = true;
  try {
    ui.state.hidden = false;
    ui.error.hidden = true;
    ui.done.hidden = true;
    ui.progress.hidden = false;
    ui.progress.removeAttribute("value");
    ui.status.textContent = "Uploading…";
    const job = await api.uploadImport(file);
    await follow(job.id);
  } catch (error) {
    showError(error.message);
  } finally {
    ui.submit.disabled = false;
    ui.form.reset();
    refreshList();
  }
});

refreshList();
