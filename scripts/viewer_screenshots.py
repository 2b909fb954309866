"""Regenerate the screenshots of docs/guides/viewer.md ("Looking at rollouts"): one per view of the viewer.

Plays two runs of the same held-out arithmetic tasks (the demo's first run, at two temperatures: A before, B after),
serves the viewer on A compared with B, and photographs each view in the system's headless Chromium
(scripts/setup_browser.sh installs it). With SmolLM2 (the default, a minute or two on a CPU) the text is readable;
``--model tiny`` is fast but writes byte soup.

    .venv/bin/python scripts/viewer_screenshots.py [--model smollm2] [--runs DIR] [--out docs/assets/viewer]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hf_rollouts.cli import main as cli
from hf_rollouts.viewer import serve
from hf_rollouts.viewer.browser import start_browser

ROOT = Path(__file__).resolve().parents[1]
VIEWS = {
    "run": "#/",
    "tasks": "#/tasks?sort=mean_reward&desc=1",
    "group": "#/group/{row}",
    "rollout": "#/rollout/{row}/{rollout}?color=logprob",
    "compare": "#/compare?sort=delta&desc=1",
    "pair": "#/compare/{pair}",
}


def play(model: str, runs: Path) -> tuple[Path, Path]:
    """The two runs (reused when ``runs`` already holds them)."""
    out = []
    for name, temperature in (("before", "1.2"), ("after", "0.3")):
        path = runs / name
        if not (path / "state.json").is_file():
            argv = ["generate", "--env", "arithmetic", "--split", "eval", "--num-tasks", "8", "--num-rollouts", "4"]
            argv += ["--model", model, "--seed", "0", "--temperature", temperature, "--max-new-tokens", "12"]
            assert cli([*argv, "--output", str(path), "--overwrite"]) == 0, f"generate {name} failed"
        out.append(path)
    return out[0], out[1]


def shoot(before: Path, after: Path, out: Path) -> list[Path]:
    from datasets import load_from_disk

    ds = load_from_disk(str(before))
    # the group and rollout shown: the task whose rollouts differ most (some solved, some not)
    row = max(range(len(ds)), key=lambda i: (len(set(ds[i]["final_rewards"])), -i))
    rollout = min(range(len(ds[row]["final_rewards"])), key=lambda i: ds[row]["final_rewards"][i])
    server = serve(before, compare=after)
    browser = start_browser(1280, 900)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for name, fragment in VIEWS.items():
            browser.set_window_size(1280, 700)  # measured from a short window: the page's own height below
            browser.get(server.url + fragment.format(row=row, rollout=rollout, pair=row))
            time.sleep(2.5)  # the page's requests, and the run's statistics computed in the background
            if name == "run":
                browser.refresh()
                time.sleep(1.5)
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.set_window_size(1280, min(max(height + 160, 600), 2200))  # the whole view, up to a tall page
            if name == "rollout":  # hover an agent token: its tooltip (text, id, log-prob, reward)
                from selenium.webdriver.common.action_chains import ActionChains

                tokens = browser.find_elements("css selector", "#tokens .tok.agent")
                ActionChains(browser).move_to_element(tokens[min(3, len(tokens) - 1)]).perform()
                time.sleep(0.3)
            path = out / f"{name}.png"
            browser.save_screenshot(str(path))
            written.append(path)
    finally:
        browser.quit()
        server.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (readable) or tiny (fast)")
    parser.add_argument("--runs", type=Path, default=ROOT / "outputs" / "viewer_screenshots")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets" / "viewer")
    args = parser.parse_args()
    before, after = play(args.model, args.runs)
    for path in shoot(before, after, args.out):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
