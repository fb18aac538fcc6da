#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The whole background cycle from Python, with ctypes on the installed libbgtask.so.0.

    BGTASKD_SOCKET=/run/user/$UID/bgtaskd/io.bgtaskd python3 bgtask_example.py &
    bgtaskctl background $!

Sent to the background it begins a task; the expiration handler ends it; bgtaskd suspends it.
"""
import ctypes
import ctypes.util
import os
import select
import sys

lib = ctypes.CDLL(os.environ.get("BGTASK_LIBRARY") or ctypes.util.find_library("bgtask") or "libbgtask.so.0")
App = ctypes.c_void_p
LIFECYCLE = ctypes.CFUNCTYPE(None, App, ctypes.c_void_p)
EXPIRATION = ctypes.CFUNCTYPE(None, App, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
lib.bgtask_app_new.argtypes = [ctypes.POINTER(App), ctypes.c_char_p]
lib.bgtask_app_set_handlers.argtypes = [App, LIFECYCLE, LIFECYCLE, ctypes.c_void_p]
lib.bgtask_app_get_fd.argtypes = [App]
lib.bgtask_app_process.argtypes = [App]
lib.bgtask_begin.argtypes = [App, ctypes.c_char_p, EXPIRATION, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
lib.bgtask_end.argtypes = [App, ctypes.c_uint64]
lib.bgtask_time_remaining.argtypes = [App, ctypes.POINTER(ctypes.c_double)]


def say(line):
    print(line, flush=True)


app = App()
result = lib.bgtask_app_new(ctypes.byref(app), None)
if result < 0:
    sys.exit(f"cannot reach bgtaskd: {os.strerror(-result)}")


@EXPIRATION
def expired(app, task, reason, detail, userdata):
    say(f"expiration handler: task {task}, reason {reason}")
    say(f"ended task {task}: {lib.bgtask_end(app, task)}")


@LIFECYCLE
def entered_background(app, userdata):
    left = ctypes.c_double()
    lib.bgtask_time_remaining(app, ctypes.byref(left))
    say(f"entered the background with {left.value:.1f}s of background time")
    task = ctypes.c_uint64()
    result = lib.bgtask_begin(app, b"sync", expired, None, ctypes.byref(task))
    say(f"began background task {task.value}" if result == 0 else f"no background task: {os.strerror(-result)}")


@LIFECYCLE
def entering_foreground(app, userdata):
    say("back in the foreground")


lib.bgtask_app_set_handlers(app, entered_background, entering_foreground, None)
say(f"pid {os.getpid()} running in the foreground")
poller = select.poll()
poller.register(lib.bgtask_app_get_fd(app), select.POLLIN)
while True:
    poller.poll()
    lib.bgtask_app_process(app)
