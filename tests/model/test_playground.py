"""The playground page in a real headless Chromium (Debian's, driven through its chromedriver),
against a real `oars serve` on the default model. The last screen is kept as a test artifact."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

pytestmark = pytest.mark.model

ARTIFACTS = Path(
    os.environ.get("OARS_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.fail("Debian's chromium and chromium-driver are missing: `make test` installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--disable-gpu",
    ):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def _wait_status(browser: WebDriver, *statuses: str, timeout: float = 180) -> str:
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, timeout).until(lambda _: status.text in statuses)
    return str(status.text)


def _send(browser: WebDriver, message: str) -> None:
    box = browser.find_element(By.ID, "message")
    box.clear()
    box.send_keys(message)
    browser.find_element(By.ID, "send").click()


def _turns(browser: WebDriver) -> list[str]:
    return [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#transcript .turn")]


def test_the_playground_streams_calls_a_tool_and_continues(server: str, browser: WebDriver) -> None:
    base = server.removesuffix("/v1")
    browser.get(f"{base}/")
    WebDriverWait(browser, 30).until(
        lambda b: len(Select(b.find_element(By.ID, "model")).options) > 0
    )
    limit = browser.find_element(By.ID, "max_tokens")
    limit.clear()
    limit.send_keys("40")

    # 1. a reply streams in, and the validator's verdict on its events is shown
    _send(browser, "Say hello in five words.")
    assert _wait_status(browser, "completed", "incomplete") in ("completed", "incomplete")
    first = browser.find_element(By.CSS_SELECTOR, "#transcript .turn .text").text
    assert first.strip()
    verdict = browser.find_element(By.ID, "verdict")
    WebDriverWait(browser, 30).until(lambda _: verdict.text)
    assert verdict.text.startswith("valid:"), verdict.text
    events = browser.find_element(By.ID, "events").text
    assert "response.output_text.delta" in events and "response.completed" in events
    first_id = browser.find_element(By.ID, "continuing").text.removeprefix("continuing ")

    # 2. the demo tool, forced: the call and its arguments appear, then its output is sent back
    browser.find_element(By.ID, "tool").click()
    Select(browser.find_element(By.ID, "tool_choice")).select_by_visible_text("required")
    _send(browser, "What is the weather in Paris?")
    _wait_status(browser, "completed", "incomplete")
    call = browser.find_element(By.CSS_SELECTOR, "#transcript .turn:last-child .call").text
    assert call.startswith("get_weather(") and call.endswith(")") and '"city"' in call
    box = browser.find_element(By.ID, "tool_output_box")
    assert box.is_displayed()
    call_id = browser.find_element(By.ID, "continuing").text.removeprefix("continuing ")
    assert call_id != first_id
    browser.find_element(By.ID, "send_tool_output").click()
    _wait_status(browser, "completed", "incomplete")
    WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "verdict").text)
    assert browser.find_element(By.ID, "verdict").text.startswith("valid:")
    answer_id = browser.find_element(By.ID, "continuing").text.removeprefix("continuing ")
    turns = _turns(browser)
    assert len(turns) == 3 and turns[2].startswith("tool output:")

    # 3. the conversation continued: each response chains to the one before it
    stored = httpx.get(f"{server}/responses/{answer_id}", timeout=30).json()
    assert stored["previous_response_id"] == call_id
    assert (
        httpx.get(f"{server}/responses/{call_id}", timeout=30).json()["previous_response_id"]
        == first_id
    )

    # 4. stored responses are listed, and one opens
    WebDriverWait(browser, 30).until(
        lambda b: len(b.find_elements(By.CSS_SELECTOR, "#stored li[data-id]")) >= 3
    )
    listed = [
        li.get_attribute("data-id")
        for li in browser.find_elements(By.CSS_SELECTOR, "#stored li[data-id]")
    ]
    assert {first_id, call_id, answer_id} <= set(listed)
    browser.find_element(By.CSS_SELECTOR, f'#stored li[data-id="{first_id}"]').click()
    opened = browser.find_element(By.ID, "opened")
    WebDriverWait(browser, 30).until(lambda _: first_id in opened.text)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "playground.png"))
