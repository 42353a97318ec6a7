// belfry web view: refreshes the page's <main> every few seconds while the
// tab is visible and no form field is being edited. Without JavaScript the
// pages work the same, they just do not refresh themselves.
(function () {
  var every = 5000;
  function busy() {
    var a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA");
  }
  // One refresh at a time: the next is scheduled only when this one ends,
  // so a slow server is never asked twice at once.
  function next() { setTimeout(refresh, every); }
  function refresh() {
    if (document.hidden || busy() || !document.querySelector("main[data-refresh]")) return next();
    var headers = { "x-belfry-refresh": "1" };
    // A log this page is tailing (its stream open) is kept as it is.
    if (document.querySelector("#run-log[data-stream]:not([data-ended])")) headers["x-belfry-tailing"] = "1";
    fetch(location.href, { headers: headers, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("main");
        var main = document.querySelector("main");
        if (!fresh || !main || busy()) return;
        // A run's log panel being tailed stays as it is (its lines, its
        // scroll): the server sends a placeholder for it while it can grow.
        var kept = fresh.querySelector("[data-keep-log]") && document.getElementById("log-panel");
        var scrolls = [];
        if (kept) {
          kept.querySelectorAll("pre").forEach(function (p) { scrolls.push(p.scrollTop); });
          kept.remove();
        }
        main.innerHTML = fresh.innerHTML;
        var slot = kept && main.querySelector("[data-keep-log]");
        if (slot) {
          slot.replaceWith(kept);
          kept.querySelectorAll("pre").forEach(function (p, i) { p.scrollTop = scrolls[i] || 0; });
        }
      })
      .catch(function () {})
      .then(next);
  }
  next();
})();

// A running run's log, tailed live: the run page's <section id="run-log">
// names its stream (server-sent events) and the cursor of its last line.
// Each `line` event is appended once (a line at or before the section's
// cursor is skipped); the page's own refresh keeps the section while it is
// tailed (see above); `end` closes the stream.
(function () {
  var section = document.getElementById("run-log");
  if (!section || !section.dataset.stream || !window.EventSource) return;
  window.__belfry_tailed = [];
  function key(c) { var p = String(c).split("."); return [Number(p[0]), Number(p[1])]; }
  function after(a, b) { return a[0] > b[0] || (a[0] === b[0] && a[1] > b[1]); }
  function pad(n, w) { return String(n).padStart(w, "0"); }
  function text(l) {
    var t = l.message;
    if (l.kind === "progress") t = "[" + (l.done || 0) + (l.total != null ? "/" + l.total : "") + "] " + t;
    if (l.kind === "error") t = "attempt failed: " + t;
    if (l.kind === "truncated") t = "… " + t;
    var d = new Date(l.at);
    var at = pad(d.getUTCHours(), 2) + ":" + pad(d.getUTCMinutes(), 2) + ":" + pad(d.getUTCSeconds(), 2) + "." + pad(d.getUTCMilliseconds(), 3);
    var level = (l.level.toUpperCase() + "     ").slice(0, Math.max(5, l.level.length));
    return at + " " + level + " " + t + (l.fields ? " " + JSON.stringify(l.fields) : "");
  }
  var source = new EventSource(section.dataset.stream + "?after=" + encodeURIComponent(section.dataset.after), { withCredentials: true });
  source.addEventListener("line", function (e) {
    var l = JSON.parse(e.data);
    // Every line the stream delivered, even one the page's refresh drew
    // first (the browser test reads this).
    window.__belfry_tailed.push(l.message);
    var live = document.getElementById("run-log");
    if (!live || !after([l.attempt, l.seq], key(live.dataset.after))) return;
    var pre = live.querySelector('pre.log[data-attempt="' + l.attempt + '"]');
    if (!pre) {
      var empty = live.querySelector(".log-empty");
      if (empty) empty.remove();
      var h = document.createElement("h3");
      h.textContent = "Attempt " + l.attempt;
      pre = document.createElement("pre");
      pre.className = "log";
      pre.dataset.attempt = l.attempt;
      live.appendChild(h);
      live.appendChild(pre);
    }
    var span = document.createElement("span");
    span.className = "l l-" + l.level + " k-" + l.kind;
    span.textContent = text(l);
    pre.appendChild(span);
    pre.appendChild(document.createTextNode("\n"));
    live.dataset.after = l.attempt + "." + l.seq;
    if (l.kind === "progress") {
      var p = document.querySelector("p.progress");
      if (p) {
        p.hidden = false;
        var bar = p.querySelector("progress");
        if (l.total) { bar.max = l.total; bar.value = l.done || 0; } else { bar.removeAttribute("value"); }
        p.querySelector(".progress-text").textContent =
          (l.done || 0) + (l.total != null ? " / " + l.total : "") + " " + l.message;
      }
    }
  });
  // Closed: the page's refresh draws the panel again from then on.
  function ended() {
    source.close();
    var live = document.getElementById("run-log");
    if (live) live.dataset.ended = "1";
  }
  source.addEventListener("end", ended);
  source.addEventListener("error", function (e) {
    // An `error` event the server sent (the run is gone, the database
    // away) carries data: stop. A dropped connection carries none: the
    // browser reconnects by itself with the last event's id.
    if (e.data !== undefined) ended();
  });
})();
