"""The Toy head tab: the page's numbers (assets/toy_head.js, in a real headless Chromium) equal the
project's Python functions (dropmatch.toy_head.toy_numbers: mc_head, verifying, acceptance) on random
toy heads and masks, and each preset shows what its button says."""

from __future__ import annotations

import json

import pytest
import torch

from toy_head import PATH_RULES, TOY_RULES, keep_at, toy_numbers

from local_server import TEXT_CONTRAST_JS, assert_contrast, assert_no_horizontal_scroll, open_tab

RELATIVE = 1e-9
FLOOR = 1e-15  # float64 rounding of values that are 0 in exact arithmetic (identical paths' JS)


def random_fixtures(count: int, seed: int = 0) -> list[dict]:
    """count toy inputs: W [6, 8], h [8], q [6], keep [K, 8] for K in 1..8, p in [0, 0.8), a draft token."""
    generator = torch.Generator().manual_seed(seed)
    fixtures = []
    for i in range(count):
        k = 1 + i % 8
        p = [0.0, 0.1, 0.3, 0.5, 0.7][i % 5]
        q = torch.rand(6, generator=generator, dtype=torch.float64) ** 3
        fixtures.append({
            "W": (torch.randn(6, 8, generator=generator, dtype=torch.float64) * (0.3 + i % 4)).tolist(),
            "h": torch.randn(8, generator=generator, dtype=torch.float64).tolist(),
            "q": (q / q.sum()).tolist(),
            "keep": torch.bernoulli(torch.full((k, 8), 1 - p, dtype=torch.float64), generator=generator).tolist(),
            "p": p,
            "draft": int(torch.randint(6, (1,), generator=generator)),
        })
        if i % 2:  # half draft the paths' likeliest token other than the target's: where the path rules differ most
            numbers = python_numbers(fixtures[-1])
            others = [t for t in numbers["path_tokens"] if t != numbers["target_token"]]
            if others:
                fixtures[-1]["draft"] = max(set(others), key=others.count)
    for i in range(0, count, 10):  # and a few drawn until the paths' majority accepts what the target does not choose
        fixtures[i] = _majority_case(generator)
    return fixtures


def _majority_case(generator: torch.Generator) -> dict:
    while True:
        keep = torch.bernoulli(torch.full((5, 8), 0.6, dtype=torch.float64), generator=generator)
        fixture = {"W": torch.randn(6, 8, generator=generator, dtype=torch.float64).tolist(),
                   "h": torch.randn(8, generator=generator, dtype=torch.float64).tolist(),
                   "q": torch.softmax(torch.randn(6, generator=generator, dtype=torch.float64), 0).tolist(),
                   "keep": keep.tolist(), "p": 0.4}
        numbers = python_numbers({**fixture, "draft": 0})
        fixture["draft"] = max(numbers["majority_token"], 0)
        if python_numbers(fixture)["verdicts"]["majority"] == "majority":
            return fixture


def python_numbers(fixture: dict) -> dict:
    return toy_numbers(fixture["W"], fixture["h"], fixture["q"], fixture["keep"], fixture["p"], fixture["draft"])


def assert_close(page, reference, where: str) -> None:
    if isinstance(reference, dict):
        assert set(page) == set(reference), where
        for key in reference:
            assert_close(page[key], reference[key], f"{where}.{key}")
    elif isinstance(reference, list):
        assert len(page) == len(reference), where
        for i, (a, b) in enumerate(zip(page, reference)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(reference, str):
        assert page == reference, where
    else:
        assert abs(page - reference) <= RELATIVE * max(abs(page), abs(reference)) + FLOOR, (where, page, reference)


def test_the_fixtures_reach_every_verdict_of_every_rule():
    """The comparison is only as good as its inputs: across them, each rule accepts and rejects."""
    seen = {rule: set() for rule in TOY_RULES}
    for fixture in random_fixtures(50):
        for rule, reason in python_numbers(fixture)["verdicts"].items():
            seen[rule].add(reason)
    for rule in TOY_RULES:
        assert {"exact", "rejected"} <= seen[rule], (rule, seen[rule])
        assert len(seen[rule]) >= (2 if rule == "lossless" else 3), (rule, seen[rule])


def assert_lossless(numbers: dict, draft: int, where: str) -> None:
    """Every path rule accepts the draft only as the clean target's own top token."""
    wanted = "exact" if draft == numbers["target_token"] else "rejected"
    assert all(numbers["verdicts"][rule] == wanted for rule in PATH_RULES), (where, numbers["verdicts"], wanted)


def test_the_toy_heads_masks_follow_p_and_at_p_0_accept_only_the_targets_top_token():
    """The page's masks come from fixed draws against 1 - p: at p = 0 every path is the clean target (lossless)."""
    generator = torch.Generator().manual_seed(1)
    lossy_before = 0
    for fixture in random_fixtures(50):
        draws = torch.rand(len(fixture["keep"]), 8, generator=generator, dtype=torch.float64).tolist()
        at_p = python_numbers({**fixture, "keep": keep_at(draws, fixture["p"])})
        lossy_before += any(at_p["verdicts"][rule] not in ("exact", "rejected") for rule in PATH_RULES)
        assert keep_at(draws, 0.0) == [[1] * 8] * len(draws)
        assert_lossless(python_numbers({**fixture, "keep": keep_at(draws, 0.0), "p": 0.0}), fixture["draft"], "p = 0")
    assert lossy_before > 5  # the same draws at the fixtures' own p let the path rules accept other tokens


def test_assert_close_tells_a_wrong_number():
    numbers = python_numbers(random_fixtures(1)[0])
    wrong = json.loads(json.dumps(numbers))
    wrong["centroid"][2] *= 1 + 1e-7
    with pytest.raises(AssertionError):
        assert_close(wrong, numbers, "numbers")


# ---------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def toy_page(fake_app_page):
    return fake_app_page


def _open(browser, url: str, width: int = 1400, theme: str = "light"):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(url + f"?__theme={theme}")
    open_tab(page, "Toy head")
    page.wait_for_selector(".dm-toy [data-verdict]", timeout=60_000)
    return page


@pytest.mark.slow
@pytest.mark.browser
def test_the_pages_numbers_equal_the_python_functions_on_50_random_toy_heads(toy_page, tmp_path):
    url, browser = toy_page
    fixtures = random_fixtures(50)
    exported = tmp_path / "toy_fixtures.json"
    exported.write_text(json.dumps(fixtures))
    page = _open(browser, url)
    computed = page.evaluate("fixtures => fixtures.map((f) => window.DMToy.compute(f))", json.loads(exported.read_text()))
    for i, (fixture, numbers) in enumerate(zip(fixtures, computed)):
        assert_close(numbers, python_numbers(fixture), f"fixture {i}")
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_each_preset_shows_what_its_button_says_and_the_page_draws_its_verdicts(toy_page):
    url, browser = toy_page
    page = _open(browser, url)
    claims = {
        # a confident head: every path keeps the clean argmax, and the threshold is narrow
        "confident": lambda n: len(set(n["path_tokens"])) == 1 and n["threshold"] < 0.01
        and n["verdicts"]["dropmatch"] == "rejected",
        # a flat head: the paths spread, the threshold is wide, and JS accepts a token the target does not choose
        "flat": lambda n: n["threshold"] > 0.05 and n["verdicts"]["js"] == "js" and max(n["target_probs"]) < 0.4,
        # JS rejects, the paths' majority accepts
        "majority": lambda n: n["verdicts"]["js"] == "rejected" and n["verdicts"]["dropmatch"] == "majority",
    }
    assert sorted(page.evaluate("window.DMToy.presets()")) == sorted(claims)
    for name, claim in claims.items():
        given = page.evaluate("name => window.DMToy.presetInput(name)", name)
        numbers = toy_numbers(given["W"], given["h"], given["q"], given["keep"], given["p"], given["draft"])
        assert claim(numbers), (name, numbers["verdicts"], numbers["threshold"])
        page.locator(f"[data-preset={name}]").click()
        shown = {rule: page.locator(f"[data-verdict={rule}]").get_attribute("class") for rule in TOY_RULES}
        assert all(f"dm-{numbers['verdicts'][rule]}" in shown[rule].split() for rule in TOY_RULES), (name, shown)
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_moving_a_control_recomputes_live_and_new_masks_redraw_the_paths(toy_page):
    url, browser = toy_page
    page = _open(browser, url)
    page.locator("[data-preset=flat]").click()
    before = page.locator(".dm-toy-table").first.inner_text()
    slider = page.locator("input[data-field=h][data-i='0']")
    slider.fill("2.5")
    after_h = page.locator(".dm-toy-table").first.inner_text()
    assert after_h != before
    page.locator("input[data-field=k]").fill("9")
    assert page.locator("[data-path]").count() == 9
    masks = page.locator(".dm-toy-mask").all_inner_texts()
    page.locator("[data-act=masks]").click()
    assert page.locator(".dm-toy-mask").all_inner_texts() != masks
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_toy_head_at_p_0_keeps_every_coordinate_and_accepts_only_the_targets_top_token(toy_page):
    """Moving p to 0 redraws the masks (all kept): the path rules accept only the clean target's top token, as in
    Python; moving p back restores the preset's masks and its lossy verdict."""
    url, browser = toy_page
    page = _open(browser, url)
    for name in ("flat", "majority"):
        page.locator(f"[data-preset={name}]").click()
        shown = page.locator(".dm-toy-mask").all_inner_texts()
        lossy = page.evaluate("window.DMToy.current.numbers.verdicts")
        page.locator("input[data-field=p]").fill("0")
        assert set(page.locator("[data-path] .dm-toy-mask").all_inner_texts()) == {"■" * 8}
        given, numbers = page.evaluate("[window.DMToy.current.input(), window.DMToy.current.numbers]")
        assert_close(numbers, toy_numbers(given["W"], given["h"], given["q"], given["keep"], 0.0, given["draft"]), name)
        assert_lossless(numbers, given["draft"], name)
        page.locator("input[data-field=p]").fill(str(page.evaluate(f"window.DMToy.presetInput('{name}').p")))
        assert page.locator(".dm-toy-mask").all_inner_texts() == shown
        assert page.evaluate("window.DMToy.current.numbers.verdicts") == lossy
    page.close()




@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_toy_head_fits_a_phone_and_its_text_meets_4_5_contrast(toy_page, theme):
    url, browser = toy_page
    page = _open(browser, url, theme=theme)
    assert page.evaluate("document.body.classList.contains('dark')") == (theme == "dark")
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator("[data-preset=majority]").click()
    assert_no_horizontal_scroll(page)
    found = page.evaluate(TEXT_CONTRAST_JS, ".dm-toy")
    assert len(found) > 50 and {"TD", "SPAN", "BUTTON"} <= {item["tag"] for item in found}
    assert_contrast(found)
    page.close()
