// Model answers as Markdown: parsed by marked, sanitized by DOMPurify, code highlighted by
// highlight.js, each code block with a copy button.
//
// No HTML from the model ever runs or renders: raw HTML in the Markdown is shown as the text
// it is (the `html` renderer escapes it), and DOMPurify then removes anything active that could
// still slip through (scripts, event handlers, javascript: links, forms, frames). Images are
// shown as links, so an answer cannot make the browser fetch a URL by itself.

import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import hljs from "../vendor/highlight/highlight.min.js";
import { Marked } from "../vendor/marked/marked.esm.js";

function escapeHtml(text) {
  return text
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;")
    .replaceAll("'", "&#39;");
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    html({ text, block }) {
      const literal = escapeHtml(text);
      return block ? `<p class="literal">${literal}</p>\n` : literal;
    },
    image({ href, text }) {
      const label = escapeHtml(text || href || "image");
      return href ? `<a href="${escapeHtml(href)}">${label}</a>` : label;
    },
    checkbox({ checked }) {
      return checked ? "\u2611 " : "\u2610 ";
    },
  },
});

const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: [
    "style", "img", "svg", "math", "form", "input", "button", "textarea", "select", "option",
    "iframe", "frame", "frameset", "object", "embed", "video", "audio", "source", "picture",
    "link", "meta", "base", "dialog", "template",
  ],
  FORBID_ATTR: ["style", "id", "name", "srcset", "action", "formaction", "target"],
  ALLOW_DATA_ATTR: false,
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

hljs.configure({ ignoreUnescapedHTML: true });

/** Copy `text` to the clipboard; true if it worked. */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    let copied = false;
    try {
      copied = document.execCommand("copy");
    } catch {
      copied = false;
    }
    area.remove();
    return copied;
  }
}

/** A copy button whose label says "Copied" for a moment after it worked. */
export function copyButton(getText, label) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = "Copy";
  button.setAttribute("aria-label", label);
  button.addEventListener("click", async () => {
    const copied = await copyText(getText());
    button.textContent = copied ? "Copied" : "Copy failed";
    setTimeout(() => {
      button.textContent = "Copy";
    }, 1500);
  });
  return button;
}

function enhanceCodeBlocks(root) {
  for (const code of root.querySelectorAll("pre > code")) {
    const pre = code.parentElement;
    const match = /(?:^|\s)language-([\w+#.-]+)/.exec(code.className);
    const language = match ? match[1].toLowerCase() : "";
    const source = code.textContent;
    if (language && hljs.getLanguage(language)) {
      code.innerHTML = hljs.highlight(source, { language, ignoreIllegals: true }).value;
    } else {
      code.innerHTML = hljs.highlightAuto(source).value;
    }
    code.classList.add("hljs");
    const block = document.createElement("div");
    block.className = "code-block";
    const head = document.createElement("div");
    head.className = "code-head";
    const name = document.createElement("span");
    name.textContent = language || "code";
    head.append(name, copyButton(() => source, `Copy the ${language || "code"} code`));
    pre.replaceWith(block);
    block.append(head, pre);
  }
}

/** Render `text` as sanitized Markdown into `element`, replacing what it held. */
export function renderMarkdown(element, text) {
  const fragment = DOMPurify.sanitize(marked.parse(text), PURIFY);
  enhanceCodeBlocks(fragment);
  element.replaceChildren(fragment);
}
