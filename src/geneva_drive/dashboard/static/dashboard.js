// Live refresh for the geneva-drive dashboard: every few seconds, fetch this page again and
// swap in its #live part. Without JavaScript the pages still work; they just don't refresh.
// Nothing is replaced while you use a form (an open action, focus inside a form), and open
// <details> (backtraces) stay open across refreshes.
(function () {
  "use strict";
  function busy(live) {
    var active = document.activeElement;
    if (active && live.contains(active) && active.closest("form")) return true;
    return live.querySelector("details[data-hold][open]") !== null;
  }
  function refresh(live) {
    if (document.hidden || busy(live)) return Promise.resolve();
    return fetch(window.location.href, {
      headers: { "X-Requested-With": "geneva-drive-dashboard" },
      credentials: "same-origin",
      cache: "no-store",
    })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        if (!fresh || busy(live)) return;
        var open = Array.prototype.map.call(live.querySelectorAll("details[open][id]"), function (d) {
          return d.id;
        });
        live.replaceChildren.apply(live, Array.prototype.slice.call(fresh.childNodes));
        open.forEach(function (id) {
          var d = document.getElementById(id);
          if (d) d.open = true;
        });
        if (!fresh.hasAttribute("data-refresh")) live.removeAttribute("data-refresh");
        live.dispatchEvent(new CustomEvent("gd:refreshed", { bubbles: true }));
      })
      .catch(function () {
        /* the server is unreachable for a moment: try again at the next tick */
      });
  }
  function start() {
    var live = document.getElementById("live");
    if (!live || !live.hasAttribute("data-refresh")) return;
    var seconds = parseFloat(live.getAttribute("data-refresh")) || 5;
    var tick = function () {
      if (!live.hasAttribute("data-refresh")) return; // e.g. the workflow has finished
      refresh(live).then(function () {
        window.setTimeout(tick, seconds * 1000);
      });
    };
    window.setTimeout(tick, seconds * 1000);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
