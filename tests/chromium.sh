#!/usr/bin/env bash
# Makes Debian's Chromium available to the browser test (tests/airflow/test_streams_browser.py), which drives it
# with Playwright for Python through `executable_path` (Playwright cannot download its own browsers here).
#
# Installs the `chromium` package when it is missing and this runs as root, as tests/postgres.sh does for
# PostgreSQL; otherwise says why, and the browser test skips with that reason. Never fails the build by itself.
set -uo pipefail

say() { echo "browser tier: $*" >&2; }

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [[ $(id -u) != 0 ]]; then
    say "Chromium is missing and this is not root: install Debian's chromium package to run the browser test"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "Chromium is missing and there is no apt-get here; the browser test will skip"
    exit 0
fi
log=/tmp/sluice-chromium-apt-$$.log
say "Chromium is missing; installing it from the Debian packages"
if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium ||
       { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }
     } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    say "could not install Chromium; the browser test will skip"
fi
rm -f "$log"
exit 0
