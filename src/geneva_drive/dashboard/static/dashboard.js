// Live refresh for the geneva-drive dashboard: every few seconds, fetch this page again and
// swap in its #live part. Without JavaScript the pages still work; they just don't refresh.
// Nothing is replaced while you use a form (an open action, focus inside a form), open
// <details> (backtraces) stay open across refreshes, and keyboard focus stays where it was: a
// refresh that swapped out the focused link or action would otherwise drop focus to <body>,
// and the next key press (Enter on "Resume…") would do nothing.
(function () {
  "use strict";
  var FOCUSABLE = "a[href], button, summary, input, select, textarea, [tabindex]";
  // What an element is, in words that survive a refresh: its tag, target, name, value and text.
  function signature(el) {
    var parts = [el.tagName, el.getAttribute("href"), el.getAttribute("name"), el.value];
    return parts.concat([el.textContent.trim()]).join("\u0000");
  }
  function alike(live, sig) {
    return Array.prototype.filter.call(live.querySelectorAll(FOCUSABLE), function (e) {
      return signature(e) === sig;
    });
  }
  // Where focus is inside #live: an id if it has one, else its signature and which of the
  // elements alike it was (the third "Retry now…" stays the third).
  function focusKey(live, el) {
    if (el.id) return { id: el.id };
    var sig = signature(el);
    return { sig: sig, nth: alike(live, sig).indexOf(el) };
  }
  function refocus(live, key) {
    var same = key.id ? [document.getElementById(key.id)] : alike(live, key.sig);
    var target = same[Math.min(key.nth || 0, same.length - 1)];
    if (target && live.contains(target)) {
      target.focus();
      return;
    }
    // Gone with the refresh (the action no longer applies: the workflow finished, say). Focus
    // the page's heading, which says what changed, rather than drop it to <body>, from where
    // the next Tab starts at the top of the document.
    var heading = live.querySelector("h1") || live;
    if (!heading.hasAttribute("tabindex")) heading.setAttribute("tabindex", "-1");
    heading.focus({ preventScroll: true });
  }
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
        var active = document.activeElement;
        var key = active && active !== document.body && live.contains(active) ? focusKey(live, active) : null;
        live.replaceChildren.apply(live, Array.prototype.slice.call(fresh.childNodes));
        open.forEach(function (id) {
          var d = document.getElementById(id);
          if (d) d.open = true;
        });
        if (key) refocus(live, key);
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

// Narrow screens. A filtered list opened from a link shows its rows in the first screen: the
// "More filters" panel, open because a filter is set, is closed (its summary says how many are
// set). And a table whose columns run past its box says so, because a phone hides them without
// a scroll bar: its box gets data-wider, which the stylesheet turns into a hint.
(function () {
  "use strict";
  var NARROW = "(max-width: 40rem)";
  function collapseFilters() {
    if (!window.matchMedia(NARROW).matches) return;
    Array.prototype.forEach.call(document.querySelectorAll("details.more[open]"), function (d) {
      d.open = false;
    });
  }
  function markWide(root) {
    Array.prototype.forEach.call(root.querySelectorAll(".scroll"), function (box) {
      box.toggleAttribute("data-wider", box.scrollWidth > box.clientWidth + 1);
    });
  }
  function ready() {
    collapseFilters();
    markWide(document);
  }
  document.addEventListener("gd:refreshed", function (event) {
    markWide(event.target);
  });
  window.addEventListener("resize", function () {
    markWide(document);
  });
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
