#!/usr/bin/env bash
# Install the Debian packages the test suite needs, when they are missing and we are root:
# chromium for the browser tests, postgresql for the tests that run on PostgreSQL too.
# Without root the tests needing them skip themselves and say why.
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system-deps: missing ${need[*]} (not root or no apt-get); tests needing them will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d: install the server without starting Debian's own cluster (the tests start
# throwaway ones), also where no init system runs.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1; fi
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi
echo "system-deps: installed ${need[*]}"
