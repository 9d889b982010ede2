// Follows a running build's log on the admin page: asks for the lines after the last one shown, appends them,
// and when the build ends loads the page again (the package list has changed). Without this script the build's
// own page (/admin/builds/N) refreshes itself instead.
"use strict";

function follow(box) {
  const id = box.dataset.follow;
  let offset = Number(box.dataset.offset || 0);
  const log = box.querySelector("[data-role=log]");
  const state = box.querySelector("[data-role=state]");
  const error = box.querySelector("[data-role=error]");

  async function poll() {
    let build;
    try {
      const response = await fetch(`/admin/builds/${id}.json?offset=${offset}`, { credentials: "same-origin" });
      if (!response.ok) return setTimeout(poll, 2000);
      build = await response.json();
    } catch (e) {
      return setTimeout(poll, 2000);
    }
    if (build.log.lines.length) {
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.append(build.log.lines.join("\n") + "\n");
      if (atBottom) log.scrollTop = log.scrollHeight;
    }
    offset = build.log.next_offset;
    state.textContent = build.state;
    state.className = `badge ${build.state}`;
    if (build.error) {
      error.textContent = build.error;
      error.hidden = false;
    }
    if (build.state === "succeeded" || build.state === "failed") {
      box.dataset.finished = build.state;
      setTimeout(() => window.location.assign(`/admin?notice=${encodeURIComponent(`build ${id} ${build.state}`)}#build-${build.language}`), 600);
      return;
    }
    setTimeout(poll, 700);
  }
  poll();
}

document.querySelectorAll("[data-role=log]").forEach((log) => { log.scrollTop = log.scrollHeight; });  // the end first
document.querySelectorAll("[data-follow]").forEach(follow);
