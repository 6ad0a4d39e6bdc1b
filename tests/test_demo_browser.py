"""The demo in a real browser: headless Chromium from Debian's `chromium` package (`.ci/run` installs it with
apt-get), driven by Playwright. Loads the page, shows that bad input gives a message, races the default
schedules with the app's defaults (answer length, timed runs per schedule), waits for the end and checks what is
rendered; saves the screenshot `docs/demo.png` (shown in docs/demo.md)."""

from pathlib import Path

import pytest
from playwright import sync_api

from hf_packed_ss import bundled
from hf_packed_ss.tools.demo import load_app

demo = load_app()  # demo/app.py: the Gradio app, with the names it uses from hf_packed_ss.tools.race

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "demo.png"
MAX_NEW = demo.DEFAULT_MAX_NEW_TOKENS  # the app's defaults: the screenshot in docs/demo.md shows what a user gets
pytestmark = [pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")]  # gradio's own pandas deprecations
assert CHROMIUM.exists(), "the browser test needs Debian's chromium at /usr/bin/chromium: apt-get install chromium"


@pytest.fixture(scope="module")
def url():
    name = demo.default_model()
    model, tokenizer = bundled.load(name)
    blocks = demo.build_app(model, tokenizer, name, replay_s=(1.5, 5.0))
    yield demo.launch(blocks, block=False, quiet=True)
    blocks.close()


def test_race_in_chromium(url):
    expect = sync_api.expect
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1480, "height": 900})
            page.goto(url)
            prompt = page.locator("#prompt textarea")
            expect(prompt).to_have_value(demo.EXAMPLES[0], timeout=30_000)
            expect(page.locator("#max-new-tokens input[type=number]")).to_have_value(str(MAX_NEW))
            expect(page.locator("#repeats input[type=number]")).to_have_value(str(demo.DEFAULT_REPEATS))
            lanes = {m: page.locator(f"#lane-{m} .race-lane") for m in demo.DEFAULT_SCHEDULES}

            # bad input: a message, no traceback, and the page keeps working
            prompt.fill("")
            page.locator("#race-btn").click()
            expect(page.get_by_text("The prompt is empty").first).to_be_visible(timeout=15_000)
            expect(page.get_by_text("Traceback")).to_have_count(0)
            page.get_by_test_id("toast-close").first.click()
            expect(page.get_by_test_id("toast-body")).to_have_count(0)

            prompt.fill(demo.EXAMPLES[1])
            page.locator("#race-btn").click()
            expect(page.locator("#race-status")).to_contain_text("Racing", timeout=30_000)  # the replay is live
            expect(page.locator("#verdict")).to_contain_text("produced identical text", timeout=60_000)

            texts = []
            for mode, lane in lanes.items():
                expect(lane).to_have_attribute("data-finished", "true")
                assert lane.locator(".lane-name").inner_text() == demo.LABELS[mode]
                tokens = int(lane.get_attribute("data-tokens"))
                assert 0 < tokens <= MAX_NEW and lane.locator(".tok").count() == tokens
                texts.append(lane.locator(".lane-text").inner_text())
            assert len(set(texts)) == 1 and texts[0].strip()
            assert lanes["ar"].locator(".tok.k-verifier").count() == int(lanes["ar"].get_attribute("data-tokens"))
            assert lanes["ar"].locator(".tok.k-draft").count() == 0
            summary = page.locator("#summary")
            for label in ("AR", "Linear-SS", "Quadratic-SS", "Packed-SS", "speed-up vs AR", "wall s range"):
                expect(summary).to_contain_text(label)
            expect(page.locator("#chart img")).to_be_visible()
            expect(page.locator("#race-status")).to_contain_text("Done. Fastest:")
            expect(page.locator("#race-status")).to_contain_text(f"median of {demo.DEFAULT_REPEATS} timed runs")
            page.locator("#chart img").scroll_into_view_if_needed()
            page.evaluate("window.scrollTo(0, 0)")
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 10_000
