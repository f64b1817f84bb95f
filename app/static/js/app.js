/* Small page behaviours that htmx does not do by itself. No inline scripts (CSP: script-src 'self'). */
(function () {
  "use strict";

  function flash(text, level) {
    var box = document.getElementById("flash");
    if (!box) { return; }
    box.innerHTML = "";
    var div = document.createElement("div");
    div.className = "flash " + (level || "bad");
    div.textContent = text;
    box.appendChild(div);
  }

  // htmx does not swap 4xx/5xx answers; tell the operator what went wrong instead of doing nothing.
  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail.xhr;
    var reason = xhr.getResponseHeader("X-RLGuard-Reason") || xhr.statusText || "request failed";
    flash("Not done: " + reason + " (HTTP " + xhr.status + ")", "bad");
  });
  document.addEventListener("htmx:sendError", function () {
    flash("The server could not be reached; the page will keep retrying.", "bad");
  });
  document.addEventListener("htmx:afterRequest", function (evt) {
    var elt = evt.detail.elt;
    if (evt.detail.successful && elt && elt.hasAttribute && elt.hasAttribute("data-clear-flash")) {
      var box = document.getElementById("flash");
      if (box) { box.innerHTML = ""; }
    }
  });
})();
