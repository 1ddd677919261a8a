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
    // Leave the page alone while hidden, or while the user works in a form inside it.
    if (document.hidden || live.contains(document.activeElement)) return;
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
