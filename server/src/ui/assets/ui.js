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
    fetch(location.href, { headers: { "x-belfry-refresh": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("main");
        var main = document.querySelector("main");
        if (fresh && main && !busy()) main.innerHTML = fresh.innerHTML;
      })
      .catch(function () {})
      .then(next);
  }
  next();
})();
