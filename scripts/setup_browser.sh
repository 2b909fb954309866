#!/usr/bin/env bash
# The system browser for the viewer's browser tests (tests/test_viewer_browser.py, scripts/viewer_screenshots.py):
# Debian's `chromium` and `chromium-driver`, installed with apt-get where they are missing and apt-get can run (as root,
# or with sudo that asks no password). Selenium comes with the test extra. Exit 1, with the reason, where they cannot be
# installed: the browser tests then skip and pytest's summary says why. SKIP_BROWSER=1 leaves them out.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "${SKIP_BROWSER:-0}" = 1 ]; then
    echo "SKIP_BROWSER=1: chromium/chromedriver not installed" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "no chromium/chromedriver and no apt-get to install them (install a Chromium and its chromedriver)" >&2
    exit 1
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
    if sudo -n true 2>/dev/null; then SUDO=(sudo -n); else
        echo "no chromium/chromedriver, and apt-get needs root: run 'apt-get install -y chromium chromium-driver'" >&2
        exit 1
    fi
fi
"${SUDO[@]}" apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
