"""The Files page in headless Chromium, against gunicorn as the service user and real account volumes.

A customer signs in, makes a folder, uploads a file through the file input and
another by a drop on the page (a drop event its script receives, with a
DataTransfer of a File, as a drag from the desktop delivers), sees both listed,
downloads one (the same bytes, by SHA-256), and deletes them; the API's
``/files`` answers agree at each step, since both read the account's storage
through the run-as helper as the account's Unix user. Every page is checked
for console errors, which is also how a CSP violation shows.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.live import test_browser, test_storage
from tests.live.conftest import Server
from tests.live.test_browser import severe_console_messages, sign_in

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow, test_browser.pytestmark]
# Fixtures of the modules next door: headless Chromium, and gunicorn with account volumes behind the run-as helper.
browser = test_browser.browser
storage_root = test_storage.storage_root
storage_settings = test_storage.storage_settings
volumes = test_storage.volumes
server = test_storage.server
tokens = test_storage.tokens

FOLDER = "from the browser"
UPLOADED = "weights #1.bin"
DROPPED = "notes.txt"
DROPPED_TEXT = "dropped on the page\n"
# Notes each value the progress bar takes, in the tab's sessionStorage: the page reloads once its uploads are done.
WATCH_PROGRESS = """
sessionStorage.setItem('progress', '[]');
const bar = document.getElementById('upload-progress');
new MutationObserver(() => {
  const seen = JSON.parse(sessionStorage.getItem('progress'));
  seen.push([bar.hidden, Number(bar.value)]);
  sessionStorage.setItem('progress', JSON.stringify(seen));
}).observe(bar, {attributes: true});
"""
# A drop of one file on the drop zone, as the browser delivers a drag from the desktop.
DROP = """
const transfer = new DataTransfer();
transfer.items.add(new File([arguments[1]], arguments[0], {type: 'text/plain'}));
const zone = document.getElementById('dropzone');
zone.dispatchEvent(new DragEvent('dragover', {dataTransfer: transfer, bubbles: true, cancelable: true}));
zone.dispatchEvent(new DragEvent('drop', {dataTransfer: transfer, bubbles: true, cancelable: true}));
"""


def listed(driver: WebDriver) -> dict[str, str]:
    """The page's rows: name -> size as shown.

    Read in one script, so a page that reloads (after a delete) is read whole, before or after, never
    as rows of the old page gone stale between two WebDriver calls.
    """
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#files tbody tr[data-name]'),"
        " row => [row.dataset.name, row.querySelector('td.size').innerText.trim()]);"
    )
    return {name: size for name, size in rows}


def api_names(server: Server, token: str, folder: str) -> set[str]:
    status, _, body = test_storage.raw_request(server, "GET", "/files/" + urllib.parse.quote(folder), token)
    assert status == 200, body
    return {entry["name"] for entry in body["entries"]}


def test_a_customer_uploads_downloads_and_deletes_on_the_files_page(
    server: Server, browser: WebDriver, tokens: dict[str, str], volumes: tuple[str, str], tmp_path: Path,
) -> None:
    account, other = volumes
    token = tokens[account]
    sign_in(browser, server, token)
    browser.find_element(By.LINK_TEXT, "Files").click()
    wait_for(lambda: browser.current_url == server.url + "/ui/files/", timeout_s=15, what="the Files page")
    assert "stored" in browser.find_element(By.ID, "storage-usage").text

    # A folder, from the form; then its page, through its link.
    browser.find_element(By.ID, "mkdir-name").send_keys(FOLDER)
    browser.find_element(By.ID, "mkdir-button").click()
    wait_for(lambda: FOLDER in listed(browser), timeout_s=15, what="the new folder listed")
    assert FOLDER in api_names(server, token, "")
    browser.find_element(By.CSS_SELECTOR, f'tr[data-name="{FOLDER}"] a.folder').click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#files tr.empty"), timeout_s=15, what="the empty folder's page")

    # Upload through the file input: 3 MiB of random bytes, with the progress bar shown and filled.
    data = os.urandom(3 * 1024 * 1024 + 17)
    source = tmp_path / UPLOADED
    source.write_bytes(data)
    browser.execute_script(WATCH_PROGRESS)
    browser.find_element(By.ID, "upload-input").send_keys(str(source))
    wait_for(lambda: UPLOADED in listed(browser), timeout_s=60, what="the uploaded file listed")
    assert listed(browser)[UPLOADED] == "3.0 MiB"
    progress = browser.execute_script("return JSON.parse(sessionStorage.getItem('progress'))")
    assert progress and progress[-1] == [False, 100], progress
    status, _, stored = test_storage.download(server, token, f"{FOLDER}/{UPLOADED}")
    assert status == 200 and hashlib.sha256(stored).hexdigest() == hashlib.sha256(data).hexdigest()

    # Upload by a drop on the page.
    browser.execute_script(DROP, DROPPED, DROPPED_TEXT)
    wait_for(lambda: DROPPED in listed(browser), timeout_s=60, what="the dropped file listed")
    status, _, stored = test_storage.download(server, token, f"{FOLDER}/{DROPPED}")
    assert (status, stored) == (200, DROPPED_TEXT.encode())
    # Another account's token sees none of it (the same 404 as a missing name).
    other_status, _, _ = test_storage.download(server, tokens[other], f"{FOLDER}/{DROPPED}")
    assert other_status == 404

    # Download through the page's link: the same bytes.
    browser.find_element(By.CSS_SELECTOR, f'tr[data-name="{UPLOADED}"] a.download').click()
    saved = tmp_path / "downloads" / UPLOADED
    wait_for(lambda: saved.exists() and saved.stat().st_size == len(data), timeout_s=60, what="the downloaded file")
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()

    # Delete both from the page; the API finds them gone.
    for name in (UPLOADED, DROPPED):
        browser.find_element(By.CSS_SELECTOR, f'tr[data-name="{name}"] button.delete').click()
        wait_for(lambda name=name: name not in listed(browser), timeout_s=15, what=f"{name} gone from the page")
    assert api_names(server, token, FOLDER + "/") == set()
    # The folder, empty now, goes too.
    browser.get(server.url + "/ui/files/")
    browser.find_element(By.CSS_SELECTOR, f'tr[data-name="{FOLDER}"] button.delete').click()
    wait_for(lambda: FOLDER not in listed(browser), timeout_s=15, what="the empty folder deleted")
    assert FOLDER not in api_names(server, token, "")
    assert severe_console_messages(browser) == []
