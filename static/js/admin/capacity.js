// The admin's capacity page (templates/inference/admin_capacity.html): its two tables are
// fetched again every few seconds, as rows of display cells, and replaced. Text only: a cell
// never becomes markup.
"use strict";

(() => {
  const page = document.getElementById("capacity");
  if (!page) return;
  const url = page.dataset.url;
  const seconds = Number(page.dataset.refreshSeconds) || 5;
  const updated = document.getElementById("capacity-updated");

  function fill(tableId, rows) {
    const body = document.querySelector(`#${tableId} tbody`);
    body.replaceChildren(
      ...rows.map((cells) => {
        const tr = document.createElement("tr");
        tr.replaceChildren(
          ...cells.map((text) => {
            const td = document.createElement("td");
            td.textContent = text;
            return td;
          }),
        );
        return tr;
      }),
    );
  }

  async function refresh() {
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const data = await response.json();
      fill("capacity-tiers", data.tiers);
      fill("capacity-workers", data.workers);
      updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      updated.textContent = `not updated: ${error.message}`;
    }
  }

  setInterval(refresh, seconds * 1000);
})();
