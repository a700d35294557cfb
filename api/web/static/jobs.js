// The jobs list: re-read GET /jobs (through the page's session) every few seconds
// and redraw the rows. Text goes in with textContent only, never as HTML.
"use strict";

(function () {
  const table = document.getElementById("jobs");
  if (!table) {
    return;
  }
  const adminColumns = table.tHead.rows[0].cells.length > 7;
  const jobUrl = table.dataset.jobUrl;

  function cell(row, text, className) {
    const td = row.insertCell();
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (className) {
      td.className = className;
    }
    return td;
  }

  function draw(jobs) {
    const body = document.createElement("tbody");
    for (const job of jobs) {
      const row = body.insertRow();
      row.dataset.jobId = job.job_id;
      const name = cell(row, "", "name");
      const link = document.createElement("a");
      link.href = jobUrl.replace("JOB_ID", encodeURIComponent(job.job_id));
      link.textContent = job.name;
      name.appendChild(link);
      cell(row, job.state + (job.reason ? " (" + job.reason + ")" : ""), "state state-" + job.state.toLowerCase());
      cell(row, job.template);
      cell(row, job.gpus + (job.gpu_type ? " × " + job.gpu_type : ""));
      cell(row, job.submitted_at, "time");
      cell(row, job.started_at, "time");
      cell(row, job.ended_at, "time");
      if (adminColumns) {
        cell(row, job.account);
      }
    }
    if (!jobs.length) {
      const row = body.insertRow();
      row.className = "empty";
      const td = cell(row, "No jobs yet.");
      td.colSpan = 7;
    }
    table.replaceChild(body, table.tBodies[0]);
  }

  async function refresh() {
    try {
      const answer = await fetch(table.dataset.source, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (answer.status === 401) {
        window.location.reload(); // the session ended: the page itself sends us to sign in
        return;
      }
      if (answer.ok) {
        draw((await answer.json()).jobs);
      }
    } catch (error) {
      // The server is restarting or the network blinked: the next tick tries again.
    }
    window.setTimeout(refresh, 3000);
  }

  window.setTimeout(refresh, 3000);
})();
