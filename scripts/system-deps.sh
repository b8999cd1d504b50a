#!/usr/bin/env bash
# Install the Debian packages the test suite needs, when they are missing and we are root.
# Without root the browser tests skip themselves and say why.
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system-deps: missing ${need[*]} (not root or no apt-get); tests needing them will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "system-deps: installed ${need[*]}"
