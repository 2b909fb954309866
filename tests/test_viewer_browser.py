"""The viewer in a real headless browser (the system's Chromium, driven by Selenium): click run -> task -> group ->
rollout -> compare on rollouts of the tiny model and of scripted agents, and check what the page shows against the
dataset; hostile model text stays text. One browser for the module. Skipped, with the reason, where no Chromium,
chromedriver or selenium is installed (scripts/test.sh installs them)."""

from __future__ import annotations

import math

import pytest
from datasets import load_from_disk
from viewer_rollouts import (
    HOSTILE,
    SHADOWING,
    UNPARSED,
    deep_infos,
    model_rollouts,
    scripted_rollouts,
    shadowing_columns,
    tool_rollouts,
    variant,
    with_alias_bomb,
)

from hf_rollouts.viewer import serve, write_html
from hf_rollouts.viewer.api import MAX_FILTERS
from hf_rollouts.viewer.browser import missing, start_browser
from hf_rollouts.viewer.server import Viewer, ViewerServer
from hf_rollouts.viewer.source import open_rollouts

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"the browser tests need {missing()}")


@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny):
    from hf_rollouts.agents.hf import TransformersAgent

    root = tmp_path_factory.mktemp("viewer_browser")
    agent = TransformersAgent(tiny[0], tiny[1], temperature=1.0, max_new_tokens=10, seed=0)
    return {
        "scripted": scripted_rollouts(tiny[1], root / "scripted", root / "cache"),
        "model": model_rollouts(agent, root / "model", root / "cache"),
        "tools": tool_rollouts(tiny[1], root / "tools", root / "cache"),
        "root": root,
    }


@pytest.fixture(scope="module")
def model_server(data):
    server = serve(data["model"], compare=data["scripted"])
    yield server
    server.close()


def wait_for(driver, css: str, timeout: float = 20):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css)))


def find(driver, css: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def rows_listed(driver, expected: list[int], timeout: float = 20) -> list[int]:
    """The task table's ``data-row`` values once they equal ``expected`` (or, after ``timeout``, as they are then).

    The page re-renders the table after a filter or a sort arrives, so rows read right after a click can belong to
    the previous render (a stale element under load): read them again until the new render is there."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def read(d):
        try:
            return [int(tr.get_attribute("data-row")) for tr in find(d, "#task-table tbody tr")]
        except StaleElementReferenceException:
            return None

    try:
        WebDriverWait(driver, timeout).until(lambda d: read(d) == expected)
    except TimeoutException:
        pass
    return read(driver)


def shown(value: float | None) -> str:
    """A number as the page prints it (fmt() in app.js)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return str(int(value)) if float(value).is_integer() else f"{value:.4f}"


def test_click_from_the_run_to_a_token(browser, model_server, data):
    from selenium.webdriver.common.action_chains import ActionChains

    ds = load_from_disk(str(data["model"]))
    browser.get(model_server.url)
    assert wait_for(browser, "#run-tasks").text == "3"
    assert browser.find_element("id", "run-rollouts").text == "6"
    wait_for(browser, "#run-stats")  # the card's statistics, computed in the background, replace the placeholder
    statuses = [s for row in ds["statuses"] for s in row]
    status = statuses[0]
    card = find(browser, f'#run-statuses [data-status="{status}"]')[0]
    assert card.text.split()[0] == str(statuses.count(status))
    card.click()  # run -> the tasks with a rollout of that status
    wait_for(browser, "#task-table tbody tr")
    listed = [int(tr.get_attribute("data-row")) for tr in find(browser, "#task-table tbody tr")]
    assert listed == [i for i, s in enumerate(ds["statuses"]) if status in s]
    find(browser, '#task-table tbody tr[data-row="1"]')[0].click() if 1 in listed else find(
        browser, "#task-table tbody tr"
    )[0].click()
    wait_for(browser, "#group .rollout-card")
    row = int(browser.find_element("id", "group").get_attribute("data-row"))
    cards = find(browser, "#group .rollout-card")
    assert [c.find_element("css selector", ".reward").text for c in cards] == [
        shown(r) for r in ds[row]["final_rewards"]
    ]
    assert [c.find_element("css selector", ".status").text for c in cards] == ds[row]["statuses"]
    task_text = find(browser, "#group pre.task")[0].text  # the task rows' exact JSON text, shown as stored
    assert f"env_config: {ds[row]['env_config']}" in task_text and f"task_data: {ds[row]['task_data']}" in task_text
    cards[1].find_element("css selector", ".open-rollout").click()  # group -> rollout 1
    wait_for(browser, "#messages .message")
    contents = [m.text for m in find(browser, "#messages .message .content")]
    assert contents == [m["content"] for m in ds[row]["conversations"][1]]
    agent_ids = [int(t.get_attribute("data-id")) for t in find(browser, "#tokens .tok.agent")]
    item = ds[row]
    mask, ids, logprobs = (
        item["padded_agent_token_mask"][1],
        item["padded_full_token_ids"][1],
        item["padded_logprobs"][1],
    )
    assert agent_ids == [i for i, m in zip(ids, mask) if m]
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "colour-by")).select_by_value("logprob")  # colour the tokens on demand
    wait_for(browser, ".legend")
    token = find(browser, "#tokens .tok.agent")[0]
    assert token.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
    ActionChains(browser).move_to_element(token).perform()
    tip = browser.find_element("id", "tip").text
    position = int(token.get_attribute("data-pos"))
    assert f"id     {ids[position]}" in tip and f"logprob {logprobs[position]:.6f}" in tip


def test_compare_two_runs_side_by_side(browser, model_server, data):
    after = load_from_disk(str(data["scripted"]))
    browser.get(model_server.url + "#/compare?sort=row")
    wait_for(browser, "#compare-table tbody tr")
    assert browser.find_element("id", "cmp-matched").text == "3"
    rows = find(browser, "#compare-table tbody tr")
    rows[0].click()
    wait_for(browser, "#pair-b .rollout-card")
    rewards_b = [e.text for e in find(browser, "#pair-b .rollout-card .reward")]
    assert rewards_b == [shown(r) for r in after[0]["final_rewards"]]
    assert len(find(browser, "#pair-a .rollout-card")) == 2


def test_sort_and_filter_with_the_controls(browser, model_server, data):
    ds = load_from_disk(str(data["model"]))
    browser.get(model_server.url + "#/tasks")
    wait_for(browser, "#task-table tbody tr")
    browser.find_element("id", "filter-column").send_keys("difficulty")
    browser.find_element("id", "filter-value").send_keys("hard")
    browser.find_element("id", "filter-add").click()
    wait_for(browser, ".filters .filter")
    hard = [i for i, d in enumerate(ds["difficulty"]) if d == "hard"]
    assert rows_listed(browser, hard) == hard
    find(browser, 'th[data-column="row"]')[0].click()
    wait_for(browser, 'th[data-column="row"]')
    browser.get(model_server.url + "#/tasks?sort=row&desc=1")
    wait_for(browser, "#task-table tbody tr")
    assert rows_listed(browser, [2, 1, 0]) == [2, 1, 0]


@pytest.mark.parametrize("mode", ["server", "html"])
def test_hostile_model_text_stays_text(browser, data, mode):
    ds = load_from_disk(str(data["scripted"]))
    row, i = next(
        (r, i)
        for r in range(len(ds))
        for i, c in enumerate(ds[r]["conversations"])
        if any(HOSTILE == m["content"] for m in c)
    )
    server = serve(data["scripted"]) if mode == "server" else None
    try:
        base = server.url if server else write_html(data["scripted"], data["root"] / "page.html")
        browser.get(f"{base}#/rollout/{row}/{i}")
        wait_for(browser, "#messages .message")
        assert HOSTILE in [m.text for m in find(browser, "#messages .content")]  # shown, as text
        find(browser, "#tokens .tok")[0].click()
        assert browser.execute_script("return window.PWNED") is None
        assert not find(browser, "main img") and not find(browser, "main script") and not find(browser, "#evil")
        browser.get(f"{base}#/group/{row}")
        wait_for(browser, "#group .last-reply")
        assert browser.execute_script("return window.PWNED") is None and not find(browser, "main img")
    finally:
        if server:
            server.close()


def test_tool_calls_and_results_in_a_rollout(browser, data):
    ds = load_from_disk(str(data["tools"]))
    record, messages = ds[0]["tool_calls"][0][0], ds[0]["conversations"][0]
    server = serve(data["tools"])
    try:
        browser.get(f"{server.url}#/group/0")
        wait_for(browser, "#group .rollout-card")
        assert "tool calls\n1" in find(browser, "#group .rollout-card")[0].text
        browser.get(f"{server.url}#/rollout/0/0")
        wait_for(browser, "#tool-calls tbody tr")
        cells = [td.text for td in find(browser, "#tool-calls tbody tr td")]
        assert cells[:4] == [str(record["turn"]), record["name"], record["arguments"], record["status"]]
        call = messages[2]["tool_calls"][0]["function"]
        assert [e.text for e in find(browser, "#messages .tool-call")] == [f"call {call['name']}({call['arguments']})"]
        result = "".join(t.text for t in find(browser, "#tokens .segment.tool .tok"))
        assert messages[3]["role"] == "tool" and messages[3]["content"] in result  # the result's tokens, marked
    finally:
        server.close()


def test_the_one_file_page_sorts_filters_searches_and_compares(browser, data):
    ds = load_from_disk(str(data["model"]))
    page = write_html(data["model"], data["root"] / "both.html", compare=data["scripted"])

    def rows(fragment: str) -> list[int]:
        browser.get("about:blank")
        browser.get(page + fragment)
        wait_for(browser, "#page-info")
        return [int(tr.get_attribute("data-row")) for tr in find(browser, "#task-table tbody tr")]

    assert rows("#/tasks?sort=row&desc=1") == [2, 1, 0]
    assert rows("#/tasks?where=difficulty:eq:hard") == [i for i, d in enumerate(ds["difficulty"]) if d == "hard"]
    word = ds[1]["conversations"][0][-1]["content"].split()[0]  # a word of a reply, searched by the page itself
    hits = [
        i
        for i, c in enumerate(ds["conversations"])
        if any(word.lower() in (m["content"] or "").lower() for r in c for m in r)
    ]
    assert rows("#/tasks?q=" + word) == hits
    browser.get(page + "#/compare?sort=row")
    wait_for(browser, "#compare-table tbody tr")
    find(browser, "#compare-table tbody tr")[1].click()
    wait_for(browser, "#pair-b .rollout-card")
    assert browser.find_element("css selector", "#pair h2").text.startswith("Task A 1 / B 1")
    assert len(find(browser, "#pair-a .rollout-card")) == len(find(browser, "#pair-b .rollout-card")) == 2


# -- the viewer's edges (issue 50, item 8; their HTTP side: test_viewer_edges.py) -----------------------------------
def test_a_card_with_yaml_aliases_says_so_on_the_run_page(browser, data):
    """Was: the alias bomb's 531441 tags were sent and put on the page (three more YAML lines: gigabytes)."""
    folder = with_alias_bomb(data["scripted"], data["root"] / "bomb")
    with serve(folder) as server:
        browser.get(server.url)
        error = wait_for(browser, "#run-card-error").text
        assert "uses an alias (*a" in error and "reads no YAML aliases" in error
        assert "model" in browser.find_element("id", "run-card").text  # the body's provenance is still shown
        assert "lol" not in browser.find_element("id", "run").text


@pytest.mark.parametrize("mode", ["server", "html"])
def test_deeply_nested_infos_show_as_text(browser, data, tiny, mode):
    """Was: the server dropped the connection (json.loads' RecursionError) and the page showed a fetch error."""
    folder = variant(data["scripted"], tiny[1], data["root"] / f"deep-{mode}", deep_infos)
    server = serve(folder) if mode == "server" else None
    try:
        base = server.url if server else write_html(folder, data["root"] / "deep.html")
        browser.get(f"{base}#/rollout/0/0")
        assert wait_for(browser, "#rollout-infos").get_attribute("textContent") == UNPARSED
        browser.get("about:blank")
        browser.get(f"{base}#/group/0")
        wait_for(browser, "#group .rollout-card")
        shown = [e.get_attribute("textContent") for e in find(browser, "#group pre.infos")]
        assert shown[0] == UNPARSED and not find(browser, "#view-error")
    finally:
        if server:
            server.close()


def test_too_many_filters_are_refused_with_the_reason(browser, model_server):
    browser.get(model_server.url + "#/tasks?" + "&".join(["where=length:gt:0"] * (MAX_FILTERS + 1)))
    assert f"a request holds at most {MAX_FILTERS}" in wait_for(browser, "#view-error").text
    browser.get(model_server.url + "#/tasks?" + "&".join(["where=length:gt:0"] * MAX_FILTERS))
    wait_for(browser, "#task-table tbody tr")
    assert len(find(browser, "#task-table tbody tr")) == 3


def test_user_columns_named_like_built_in_fields_keep_their_own_place(browser, data, tiny):
    """Was: the table's row, env and mean-reward cells showed the user's columns of those names."""
    folder = variant(data["scripted"], tiny[1], data["root"] / "shadow", shadowing_columns)
    ds = load_from_disk(str(folder))
    with serve(folder) as server:
        browser.get(server.url + "#/tasks?sort=row")
        wait_for(browser, "#task-table tbody tr")
        headers = [th.get_attribute("data-column") for th in find(browser, "#task-table th[data-column]")]
        assert {f"user.{name}" for name in SHADOWING} <= set(headers) and headers.count("row") == 1
        cells = {c: headers.index(c) for c in ("row", "env", "mean_reward", "user.row", "user.env")}
        rows = [
            [td.text for td in tr.find_elements("css selector", "td")] for tr in find(browser, "#task-table tbody tr")
        ]
        assert [r[cells["row"]] for r in rows] == ["0", "1", "2"]
        assert [r[cells["env"]] for r in rows] == ["MastermindEnv"] * 3
        assert [r[cells["user.row"]] for r in rows] == ["7", "8", "9"]
        assert [r[cells["user.env"]] for r in rows] == SHADOWING["env"]
        means = [
            sum(x for x in r if not math.isnan(x)) / max(1, sum(not math.isnan(x) for x in r))
            for r in ds["final_rewards"]
        ]
        assert [r[cells["mean_reward"]] for r in rows] == [shown(m) for m in means]
        browser.find_element("id", "filter-column").send_keys("user.row")
        browser.find_element("id", "filter-op").send_keys("≥")
        browser.find_element("id", "filter-value").send_keys("8")
        browser.find_element("id", "filter-add").click()
        wait_for(browser, ".filters .filter")
        assert rows_listed(browser, [1, 2]) == [1, 2]
        browser.get(server.url)
        assert "your column 'rewards' is shown as 'user.rewards'" in wait_for(browser, "#run").text


@pytest.mark.parametrize("host", ["::1", "127.0.0.2"])
def test_the_page_works_on_every_loopback_address(browser, data, host):
    """Was: ``::1`` could not be bound. A server on 127.0.0.2 now checks ``Host`` (it made no check before: the HTTP
    test shows another name refused there); the browser's own ``Host`` passes it."""
    with ViewerServer(Viewer(open_rollouts(data["scripted"])), host).start() as server:
        browser.get(server.url)
        assert wait_for(browser, "#run-tasks").text == "3"
        browser.get(server.url + "#/rollout/0/0")
        assert wait_for(browser, "#messages .message")
