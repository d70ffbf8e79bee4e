#!/usr/bin/env bash
# The Debian packages serving-bench uses beyond Python, in one place. Installs the missing ones where it can (root,
# apt-get present; non-interactive); elsewhere prints the exact command and exits 0, so `make` goes on without them.
#
#   scripts/install_system_packages.sh [--strict] [GROUP ...]      # default: every group
#
# Groups (what each is for, and what happens without it):
#   sender         g++ pkg-config libgrpc++-dev   the native sender; without it the Python sender (a fifth of its rate)
#   browser        chromium chromium-driver       the report's headless-browser test; without it that test is skipped
#   perf_analyzer  libb64-0d                      perf_analyzer 2.50 (scripts/install_perf_analyzer.sh)
#
# Quick and idempotent: only `dpkg-query` runs when every package is there. --strict (CI) exits 1 when a package is
# still missing afterwards. To check the script itself:
#   SERVING_BENCH_SYSTEM_PACKAGES="a b"  look for these packages instead of the groups' (e.g. a name that does not exist)
#   SERVING_BENCH_NO_APT=1               act as a user who cannot install: print the command, install nothing
set -uo pipefail

declare -A PACKAGES=(
  [sender]="g++ pkg-config libgrpc++-dev"
  [browser]="chromium chromium-driver"
  [perf_analyzer]="libb64-0d"
)
declare -A WITHOUT=(
  [sender]="the Python sender runs instead of the native one"
  [browser]="the report's browser test is skipped"
  [perf_analyzer]="perf_analyzer cannot be installed (its wrapper test is skipped, make bench stops)"
)
ORDER=(sender browser perf_analyzer)

strict=0
chosen=()
for arg in "$@"; do
  case "$arg" in
    --strict) strict=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) if [ -n "${PACKAGES[$arg]+set}" ]; then chosen+=("$arg")
       else echo "scripts/install_system_packages.sh: $arg: expected --strict or a group (${ORDER[*]})" >&2; exit 2; fi ;;
  esac
done
[ ${#chosen[@]} -eq 0 ] && chosen=("${ORDER[@]}")

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

# missing packages, and what their absence costs (per group; the override has no group)
missing=()
effects=()
if [ -n "${SERVING_BENCH_SYSTEM_PACKAGES:-}" ]; then
  read -r -a wanted <<<"$SERVING_BENCH_SYSTEM_PACKAGES"
  for name in "${wanted[@]}"; do installed "$name" || missing+=("$name"); done
  [ ${#missing[@]} -gt 0 ] && effects+=("asked for by SERVING_BENCH_SYSTEM_PACKAGES")
else
  for group in "${chosen[@]}"; do
    read -r -a names <<<"${PACKAGES[$group]}"
    lacking=0
    for name in "${names[@]}"; do installed "$name" || { missing+=("$name"); lacking=1; }; done
    [ "$lacking" = 1 ] && effects+=("${WITHOUT[$group]}")
  done
fi
[ ${#missing[@]} -eq 0 ] && exit 0

command_line="apt-get update && apt-get install -y ${missing[*]}"
effect="$(IFS=';'; echo "${effects[*]}" | sed 's/;/; /g')"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${SERVING_BENCH_NO_APT:-}" ]; then
  echo "system packages: installing ${missing[*]} (apt-get, about a minute)"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; then
    exit 0
  fi
  echo "system packages: apt-get could not install ${missing[*]} ($effect); install them with: $command_line" >&2
elif command -v apt-get >/dev/null 2>&1; then
  echo "system packages missing: ${missing[*]} ($effect); install them with: sudo sh -c '$command_line'" >&2
else
  echo "system packages missing: ${missing[*]} ($effect); no apt-get here: install the equivalents of these" \
       "Debian 12 packages" >&2
fi
[ "$strict" = 1 ] && exit 1
exit 0
