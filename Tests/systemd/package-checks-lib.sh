# SPDX-License-Identifier: Apache-2.0
# Sourced by the checks that run inside the package containers (package-checks.sh,
# upgrade-checks.sh): results in /out/results, one "ok NAME" or "fail NAME: why" a check.
out=/out/results
: > "$out"
ok() { echo "ok $1" >> "$out"; }
fail() { echo "fail $1: $2" >> "$out"; }
check() { local name=$1; shift; if "$@" >/tmp/check.log 2>&1; then ok "$name"; else fail "$name" "$(tail -3 /tmp/check.log | tr '\n' ' ')"; fi; }
# Waits up to $1 tenths of a second for "$2..." to succeed.
within() { local n=$1; shift; for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done; "$@"; }
export DEBIAN_FRONTEND=noninteractive
# The host is a Docker-built image whose policy-rc.d forbids starting services; the
# container is a real machine here, as a user's would be.
rm -f /usr/sbin/policy-rc.d
