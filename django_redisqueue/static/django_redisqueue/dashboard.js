// Refresh the live part of a dashboard page every few seconds, without a full reload.
// The server renders the same part alone when asked with ?partial=1.
(function () {
  "use strict";
  const live = document.getElementById("drq-live");
  if (!live) return;
  // No data-refresh (or 0): the page must stay as it is, e.g. a confirmation form.
  const seconds = parseInt(live.dataset.refresh || "0", 10);
  if (!(seconds > 0)) return;
  const url = new URL(window.location.href);
  url.searchParams.set("partial", "1");
  async function refresh() {
    // Leave the page alone while hidden, while the user works in a form inside it, or
    // while jobs are selected for an action (a refresh would drop the selection).
    if (document.hidden || live.contains(document.activeElement)) return;
    if (live.querySelector('input[name="job_id"]:checked')) return;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } });
      if (response.redirected) {
        // Logged out meanwhile: the answer is the login page, not the part. Stop here.
        window.clearInterval(timer);
        return;
      }
      if (response.ok) live.innerHTML = await response.text();
    } catch (error) {
      // The server is restarting or the network dropped: try again next time.
    }
  }
  const timer = window.setInterval(refresh, seconds * 1000);
})();

// Jobs selected for an action: "select all on page", a count, the rows highlighted. The
// checkboxes live in the part that refreshes, so listen on the document.
(function () {
  "use strict";
  const form = document.getElementById("drq-selection");
  if (!form) return;
  const counter = form.querySelector(".drq-counter");
  const boxes = () => document.querySelectorAll('input[name="job_id"][form="drq-selection"]');
  function update() {
    const all = Array.from(boxes());
    const chosen = all.filter((box) => box.checked);
    for (const box of all) box.closest("tr").classList.toggle("selected", box.checked);
    for (const toggle of document.querySelectorAll(".drq-select-all")) {
      toggle.checked = all.length > 0 && chosen.length === all.length;
      toggle.indeterminate = chosen.length > 0 && chosen.length < all.length;
    }
    counter.textContent = all.length ? `${chosen.length} of ${all.length} selected` : "";
  }
  document.addEventListener("change", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLInputElement)) return;
    if (box.classList.contains("drq-select-all")) {
      for (const other of boxes()) other.checked = box.checked;
    } else if (box.getAttribute("form") !== "drq-selection") {
      return;
    }
    update();
  });
  // A refresh brings new rows, unselected.
  const live = document.getElementById("drq-live");
  if (live) new MutationObserver(update).observe(live, { childList: true });
  update();
})();
