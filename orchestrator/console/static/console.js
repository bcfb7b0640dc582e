// The admin console's one script (served from this server; the CSP allows nothing else):
// a form marked data-confirm asks before it is sent. Everything works without it too: the
// server asks for its own confirmations (the identity switch's page, the purge's user id).
"use strict";
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form && form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
