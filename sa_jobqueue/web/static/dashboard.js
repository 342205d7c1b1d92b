// sa_jobqueue dashboard: the little the pages do in the browser, all optional.
// - Forms with data-confirm ask before they are sent.
// - On the jobs list, the header's box ticks or clears every row of the page.
// - On the overview and the jobs list, "refresh every 5 s" reloads the figures (the list's
//   rows) in place while the tab is shown, and not while rows of the list are ticked for an
//   action; the choice is remembered in this browser: untick it to pause.
"use strict";

document.addEventListener("submit", (event) => {
  const question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// Delegated to the document: the live refresh replaces the list's table, boxes and all.
(() => {
  const rows = (form) => form.querySelectorAll('input[type="checkbox"][name="id"]');
  document.querySelectorAll("input.select-page").forEach((all) => {
    all.hidden = false;
  });
  document.addEventListener("change", (event) => {
    const box = event.target;
    const form = box.form;
    // getAttribute: the form's own ``id`` property is its boxes named "id".
    if (!form || form.getAttribute("id") !== "bulk") {
      return;
    }
    const all = form.querySelector("input.select-page");
    if (box === all) {
      rows(form).forEach((row) => {
        row.checked = all.checked;
      });
    } else if (all && box.name === "id") {
      all.checked = Array.from(rows(form)).every((row) => row.checked);
    }
  });
})();

(() => {
  const toggle = document.getElementById("auto-refresh");
  if (!toggle || !document.getElementById("live")) {
    return;
  }
  const held = document.getElementById("refresh-held");
  const key = "sa_jobqueue.autoRefresh";
  toggle.checked = window.localStorage.getItem(key) === "on";
  // A list with rows ticked, or another scope chosen, for an action: a refresh would take
  // the choice away (or change the rows under it), so it waits until the boxes are clear.
  const choosing = () => {
    const form = document.getElementById("bulk");
    if (!form) {
      return false;
    }
    const ticked = form.querySelector('input[name="id"]:checked, input.select-page:checked');
    const scope = form.querySelector('input[name="scope"]:checked');
    return Boolean(ticked) || Boolean(scope && scope.value !== "selected");
  };
  const refresh = async () => {
    const holding = toggle.checked && choosing();
    if (held) {
      held.hidden = !holding;
    }
    if (!toggle.checked || holding || document.hidden) {
      return;
    }
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok || !toggle.checked || choosing()) {
        return;
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("live");
      const footer = page.querySelector("footer");
      if (fresh) {
        fresh.querySelectorAll("input.select-page").forEach((all) => {
          all.hidden = false;
        });
        document.getElementById("live").replaceWith(fresh);
      }
      if (footer) {
        document.querySelector("footer").replaceWith(footer);
      }
    } catch (error) {
      // The next round tries again; a dashboard that cannot reach its server says nothing.
    }
  };
  toggle.addEventListener("change", () => {
    window.localStorage.setItem(key, toggle.checked ? "on" : "off");
    refresh(); // at once when switched on, then every 5 s
  });
  document.addEventListener("change", () => {
    if (held) {
      held.hidden = !(toggle.checked && choosing());
    }
  });
  window.setInterval(refresh, 5000);
})();
