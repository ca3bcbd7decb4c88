"""The status page in a real headless browser (Debian's Chromium, driven by Playwright):
it loads with no console errors, and shows a server going red when it crashes and green
when it is back. It also leaves a screenshot for the README."""

import json
import pathlib
import shutil
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest

from conftest import BIN, ROOT, serve_http
from test_isolation import http_session

CHROMIUM = pathlib.Path("/usr/bin/chromium")
TOKEN = "page-token-0123456789abcdef"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def gateway(tmp_path):
    faulty = lambda name: {  # noqa: E731
        "command": str(BIN / "faulty-server"),
        "args": ["--name", name, "--state", str(tmp_path / name)],
        "recovery": {"retry": {"initial_delay_ms": 10}},
    }
    config = tmp_path / "rebound.json"
    # A slow restart keeps the crashed server down long enough to be seen.
    config.write_text(json.dumps({
        "mcpServers": {"lean": faulty("lean"), "hol": faulty("hol")},
        "rebound": {"restart": {"initial_delay_ms": 2500}},
    }))
    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        yield url


@pytest.fixture(autouse=True)
def chromium():
    assert CHROMIUM.exists(), "Debian's chromium is missing: `cargo xtask setup` installs it"


def health(page, server):
    return page.get_attribute(f'.card[data-server="{server}"]', "data-health")


def test_the_status_page_follows_a_crash_and_the_recovery(gateway):
    from playwright.sync_api import sync_playwright

    base = gateway.removesuffix("/mcp")

    def calls(tool, args, times=1):
        """Calls `tool` through the gateway (on a thread of its own: Playwright's sync API
        runs an event loop on this one)."""

        async def body(session):
            for _ in range(times):
                await session.call_tool(tool, args)

        with ThreadPoolExecutor(1) as pool:
            pool.submit(anyio.run, http_session, gateway, body, TOKEN).result(timeout=60)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        console_errors = []
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: console_errors.append(str(e)))
        page.goto(f"{base}/#token={TOKEN}")
        page.wait_for_selector('.card[data-server="lean"][data-health="green"]', timeout=15000)
        assert "token" not in page.url, "the token stays out of the address bar"
        calls("lean__echo", {"message": "hi"}, 20)
        calls("lean__flaky", {"q": "x"}, 10)
        calls("hol__echo", {"message": "hi"}, 5)
        calls("hol__crash", {})
        page.wait_for_selector('.card[data-server="hol"][data-health="red"]', timeout=5000)
        assert health(page, "lean") == "green"
        page.wait_for_selector("#errors tr", timeout=5000)
        shot = ROOT / "target" / "status-page.png"
        page.screenshot(path=str(shot), full_page=True)
        page.wait_for_selector('.card[data-server="hol"][data-health="green"]', timeout=15000)
        browser.close()
    assert console_errors == [], console_errors
    shutil.copy(shot, ROOT / "target" / "status-page-last.png")


def test_a_refused_reload_stays_in_sight_until_one_is_applied(tmp_path):
    from playwright.sync_api import sync_playwright

    config = tmp_path / "rebound.json"
    server = {"command": str(BIN / "faulty-server"), "args": ["--name", "a", "--state", str(tmp_path / "a")]}
    config.write_text(json.dumps({"mcpServers": {"a": server}}))

    def rewrite(servers):
        """Replaces the file whole, as editors do: the gateway never reads half of it."""
        new = tmp_path / "rebound.json.new"
        new.write_text(json.dumps({"mcpServers": servers}))
        new.rename(config)

    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
            page = browser.new_page()
            page.goto(f"{url.removesuffix('/mcp')}/#token={TOKEN}")
            page.wait_for_selector('.card[data-server="a"]', timeout=15000)
            assert page.inner_text("#reload") == ""
            rewrite({"a": {"args": []}})
            page.wait_for_selector("#reload.refused", timeout=15000)
            said = page.inner_text("#reload")
            assert "was refused; the running configuration keeps serving" in said, said
            assert "mcpServers.a" in said, said
            rewrite({"a": server, "b": {**server, "args": ["--name", "b"]}})
            page.wait_for_selector('.card[data-server="b"]', timeout=15000)
            page.wait_for_selector("#reload:not(.refused)", timeout=5000)
            assert "Configuration reloaded at" in page.inner_text("#reload")
            assert "added b" in page.inner_text("#reload")
            browser.close()


def test_without_the_token_the_page_shows_nothing_and_asks_for_it(gateway):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_page()
        console_errors = []
        page.on("pageerror", lambda e: console_errors.append(str(e)))
        page.goto(gateway.removesuffix("/mcp") + "/")
        page.wait_for_selector("#problem input[type=password]", timeout=10000)
        assert page.query_selector(".card") is None
        browser.close()
    assert console_errors == [], console_errors
