# SPDX-License-Identifier: Apache-2.0
# An app that handles SIGTERM (it exits 0), blocked but for a moment every 0.2 s: sent while
# the app is thawed, the signal is still pending when bgtaskd looks, however fast the thaw is
# seen (the container checks of a frozen unit that systemd stops: checks.sh,
# package-checks.sh).
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
while True:
    time.sleep(0.2)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
