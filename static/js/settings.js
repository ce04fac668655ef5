// The settings page: custom instructions and memory, through the JSON API (`api.js`).
// Every text is set with textContent: facts may come from the model.

import {
  addMemoryFact,
  confirmMemorySuggestion,
  deleteMemoryFact,
  dismissMemorySuggestion,
  editMemoryFact,
  getPersonalization,
  listMemory,
  updatePersonalization,
} from "./api.js";

const $ = (selector) => document.querySelector(selector);
const instructions = $("#instructions");
const instructionsNote = $("#instructions-note");
const suggestionsSwitch = $("#memory-suggestions");
const factList = $("#fact-list");
const suggestionList = $("#suggestion-list");
const memoryNote = $("#memory-note");
const newFact = $("#new-fact");

function button(label, name, onClick, className = "small-button") {
  const element = document.createElement("button");
  element.type = "button";
  element.className = className;
  element.textContent = label;
  element.setAttribute("aria-label", name);
  element.addEventListener("click", onClick);
  return element;
}

async function attempt(note, action, done = "") {
  note.textContent = "";
  try {
    await action();
    note.textContent = done;
  } catch (error) {
    note.textContent = error.message;
  }
}

function factRow(fact) {
  const item = document.createElement("li");
  item.dataset.factId = fact.id;
  const text = document.createElement("span");
  text.className = "fact-text";
  text.textContent = fact.text;
  const edit = button("Edit", `Edit “${fact.text}”`, () => startEdit(item, fact));
  const remove = button("Delete", `Delete “${fact.text}”`, () =>
    attempt(memoryNote, async () => {
      await deleteMemoryFact(fact.id);
      await refreshMemory();
    }, "Fact deleted."),
  "small-button danger");
  item.append(text, edit, remove);
  return item;
}

function startEdit(item, fact) {
  const input = document.createElement("input");
  input.type = "text";
  input.value = fact.text;
  input.setAttribute("aria-label", `New words for “${fact.text}”`);
  const save = button("Save", `Save “${fact.text}”`, () =>
    attempt(memoryNote, async () => {
      await editMemoryFact(fact.id, input.value);
      await refreshMemory();
    }, "Fact saved."),
  );
  const cancel = button("Cancel", "Cancel the edit", () => refreshMemory());
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") save.click();
    if (event.key === "Escape") cancel.click();
  });
  item.replaceChildren(input, save, cancel);
  input.focus();
}

function suggestionRow(fact) {
  const item = document.createElement("li");
  item.dataset.factId = fact.id;
  const text = document.createElement("span");
  text.className = "fact-text";
  text.textContent = fact.text;
  const keep = button("Remember", `Remember “${fact.text}”`, () =>
    attempt(memoryNote, async () => {
      await confirmMemorySuggestion(fact.id);
      await refreshMemory();
    }, "Fact remembered."),
  );
  const dismiss = button("Dismiss", `Dismiss “${fact.text}”`, () =>
    attempt(memoryNote, async () => {
      await dismissMemorySuggestion(fact.id);
      await refreshMemory();
    }),
  );
  item.append(text, keep, dismiss);
  return item;
}

async function refreshMemory() {
  const memory = await listMemory();
  factList.replaceChildren(...memory.facts.map(factRow));
  suggestionList.replaceChildren(...memory.suggestions.map(suggestionRow));
  $("#suggestions-title").hidden = memory.suggestions.length === 0;
  if (memory.facts.length === 0) {
    const empty = document.createElement("li");
    empty.textContent = "Nothing remembered yet.";
    factList.append(empty);
  }
}

$("#instructions-form").addEventListener("submit", (event) => {
  event.preventDefault();
  attempt(instructionsNote, async () => {
    const saved = await updatePersonalization({ instructions: instructions.value });
    instructions.value = saved.instructions;
  }, "Instructions saved.");
});

suggestionsSwitch.addEventListener("change", () =>
  attempt(memoryNote, () => updatePersonalization({ memory_suggestions: suggestionsSwitch.checked })),
);

$("#fact-form").addEventListener("submit", (event) => {
  event.preventDefault();
  attempt(memoryNote, async () => {
    await addMemoryFact(newFact.value);
    newFact.value = "";
    await refreshMemory();
  }, "Fact added.");
});

async function load() {
  const personalization = await getPersonalization();
  instructions.value = personalization.instructions;
  suggestionsSwitch.checked = personalization.memory_suggestions;
  await refreshMemory();
  document.body.dataset.ready = "1";
}

load().catch((error) => {
  memoryNote.textContent = error.message;
});
