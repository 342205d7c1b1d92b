// sa_jobqueue dashboard: the little the pages do in the browser, all optional.
// - Forms with data-confirm ask before they are sent.
// - On the jobs list, the header's box ticks or clears every row of the page.
// - On the overview, "refresh every 5 s" reloads the figures in place while the tab is shown;
//   the choice is remembered in this browser.
"use strict";

document.addEventListener("submit", (event) => {
  const question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

(() => {
  const all = document.querySelector("input.select-page");
  const form = document.getElementById("bulk");
  if (!all || !form) {
    return;
  }
  const rows = () => form.querySelectorAll('input[type="checkbox"][name="id"]');
  all.hidden = false;
  all.addEventListener("change", () => {
    rows().forEach((box) => {
      box.checked = all.checked;
    });
  });
  form.addEventListener("change", (event) => {
    if (event.target !== all && event.target.name === "id") {
      all.checked = Array.from(rows()).every((box) => box.checked);
    }
  });
})();

(() => {
  const toggle = document.getElementById("auto-refresh");
  if (!toggle || !document.getElementById("live")) {
    return;
  }
  const key = "sa_jobqueue.autoRefresh";
  toggle.checked = window.localStorage.getItem(key) === "on";
  toggle.addEventListener("change", () => {
    window.localStorage.setItem(key, toggle.checked ? "on" : "off");
  });
  const refresh = async () => {
    if (!toggle.checked || document.hidden) {
      return;
    }
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) {
        return;
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("live");
      const footer = page.querySelector("footer");
      if (fresh) {
        document.getElementById("live").replaceWith(fresh);
      }
      if (footer) {
        document.querySelector("footer").replaceWith(footer);
      }
    } catch (error) {
      // The next round tries again; a dashboard that cannot reach its server says nothing.
    }
  };
  window.setInterval(refresh, 5000);
})();
