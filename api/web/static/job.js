// One job: refresh its state and follow its logs with GET /jobs/<id>/logs?offset=N,
// as `gpupool logs -f` does. Text goes in with textContent only, never as HTML.
"use strict";

(function () {
  const facts = document.getElementById("job");
  if (!facts) {
    return;
  }
  const decoders = {};
  let finished = false;

  function show(id, text) {
    const element = document.getElementById(id);
    if (element) {
      element.textContent = text === null || text === undefined ? "" : String(text);
    }
  }

  function drawTimeline(job) {
    const list = document.getElementById("timeline");
    const events = [["Submitted", job.submitted_at], ["Started", job.started_at], ["Ended", job.ended_at]];
    const items = document.createDocumentFragment();
    let previous = null;
    for (const [label, at] of events) {
      if (!at) {
        continue;
      }
      const item = document.createElement("li");
      item.dataset.event = label.toLowerCase();
      const strong = document.createElement("strong");
      strong.textContent = label;
      const time = document.createElement("span");
      time.className = "time";
      time.textContent = " " + at + " ";
      item.append(strong, time);
      if (previous !== null) {
        const hint = document.createElement("span");
        hint.className = "hint";
        hint.textContent = "after " + Math.round((Date.parse(at) - Date.parse(previous)) / 1000) + " s";
        item.append(hint);
      }
      items.append(item);
      previous = at;
    }
    list.replaceChildren(items);
  }

  async function refreshState() {
    try {
      const answer = await fetch(facts.dataset.source, { credentials: "same-origin" });
      if (answer.ok) {
        const job = await answer.json();
        const state = document.getElementById("job-state");
        state.textContent = job.state;
        state.className = "state state-" + job.state.toLowerCase();
        show("job-reason", job.reason);
        show("job-node", job.node);
        show("job-exit", job.exit_code);
        show("job-elapsed", job.elapsed_s === null ? "" : job.elapsed_s + " s");
        drawTimeline(job);
        finished = job.ended_at !== null && job.exit_code !== null;
      }
    } catch (error) {
      // Try again on the next tick.
    }
    if (!finished) {
      window.setTimeout(refreshState, 2000);
    }
  }

  async function follow(pre) {
    const stream = pre.id;
    decoders[stream] = decoders[stream] || new TextDecoder("utf-8");
    let complete = false;
    try {
      const url = pre.dataset.source + "&offset=" + encodeURIComponent(pre.dataset.offset);
      const answer = await fetch(url, { credentials: "same-origin" });
      if (answer.ok) {
        const bytes = new Uint8Array(await answer.arrayBuffer());
        // stream: true keeps a character split between two reads for the next one.
        pre.append(document.createTextNode(decoders[stream].decode(bytes, { stream: true })));
        pre.dataset.offset = answer.headers.get("Gpupool-Next-Offset") || pre.dataset.offset;
        complete = answer.headers.get("Gpupool-Log-Complete") === "true";
        if (bytes.length) {
          pre.scrollTop = pre.scrollHeight;
        }
        if (complete) {
          pre.dataset.complete = "true";
        }
      }
    } catch (error) {
      // Try again on the next tick.
    }
    if (!complete) {
      window.setTimeout(() => follow(pre), 1500);
    }
  }

  window.setTimeout(refreshState, 1000);
  for (const pre of document.querySelectorAll("pre.log[data-source]")) {
    follow(pre);
  }
})();
