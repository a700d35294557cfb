// The Files page: upload by drag and drop or the file input, one file after another, with
// XMLHttpRequest (its upload events drive the progress bar) PUTting each file's bytes to
// /ui/data/files/<folder>/<name>, the page's CSRF value in a header. The listing is the
// server's page: reloaded when the uploads are done. Text goes in with textContent only.
"use strict";

(function () {
  const section = document.getElementById("upload");
  if (!section) {
    return;
  }
  const zone = document.getElementById("dropzone");
  const input = document.getElementById("upload-input");
  const bar = document.getElementById("upload-progress");
  const status = document.getElementById("upload-status");
  const base = section.dataset.url.slice(0, -"NAME".length);
  let busy = false;

  function say(text, failed) {
    status.textContent = text;
    status.className = failed ? "error" : "hint";
  }

  function refusal(xhr) {
    try {
      const body = JSON.parse(xhr.responseText);
      return body.message || body.error || "HTTP " + xhr.status;
    } catch (error) {
      return "HTTP " + xhr.status;
    }
  }

  function send(file, before, total) {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("PUT", base + encodeURIComponent(file.name));
      xhr.setRequestHeader("X-CSRF-Token", section.dataset.csrf);
      xhr.setRequestHeader("Content-Type", "application/octet-stream");
      xhr.upload.onprogress = (event) => {
        if (total > 0) {
          bar.value = Math.floor((100 * (before + event.loaded)) / total);
        }
      };
      xhr.onload = () => (xhr.status === 200 || xhr.status === 201 ? resolve() : reject(new Error(file.name + ": " + refusal(xhr))));
      xhr.onerror = () => reject(new Error(file.name + ": the connection failed"));
      xhr.send(file);
    });
  }

  async function upload(files) {
    if (busy || !files.length) {
      return;
    }
    busy = true;
    const total = files.reduce((sum, file) => sum + file.size, 0);
    bar.hidden = false;
    bar.value = 0;
    let before = 0;
    try {
      for (const file of files) {
        say("Uploading " + file.name + "…", false);
        await send(file, before, total);
        before += file.size;
      }
      bar.value = 100;
      say("Uploaded " + files.length + (files.length === 1 ? " file." : " files."), false);
      section.dataset.done = String(files.length);
      window.location.reload();
    } catch (error) {
      say(error.message, true);
      section.dataset.failed = error.message;
    } finally {
      busy = false;
    }
  }

  input.addEventListener("change", () => {
    upload(Array.from(input.files));
    input.value = "";
  });
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    upload(Array.from(event.dataTransfer.files));
  });
})();
