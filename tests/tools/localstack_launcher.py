"""Starts LocalStack's runtime (as `python -m localstack.runtime.main` does) for the
tests: its gateway on 127.0.0.1 only, and gone with the process that started it.

- LocalStack's twisted gateway takes the port of GATEWAY_LISTEN but ignores its host and
  listens on every interface; the tests may listen on loopback only. Its listeners are
  twisted TCP4ServerEndpoints created without an interface: they get 127.0.0.1.
- LocalStack's CloudWatch keeps datapoints in SQLite with a connection and a commit per
  datum; with SQLite's default (synchronous=FULL) each commit waits for the disk: 17-20 s
  for one request of 1,000 datums here, beyond the agent's request time-out. The tests
  need no durability: every connection gets synchronous=OFF.
- The starter keeps our stdin open. When it closes (the test process ended, however it
  ended: a panic, a signal, SIGKILL), this process group is killed at once, and the
  directory named by NEURON_LOCALSTACK_REMOVE_ON_EXIT (the instance's FILESYSTEM_ROOT)
  removed.

Usage: <LocalStack's venv>/bin/python localstack_launcher.py, configured by environment
(see node-agent/tests/support/cloudwatch.rs), in a process group of its own.
"""

import os
import shutil
import signal
import sqlite3
import sys
import threading

from twisted.internet import endpoints

_TCP4ServerEndpoint = endpoints.TCP4ServerEndpoint


class LoopbackTCP4ServerEndpoint(_TCP4ServerEndpoint):
    def __init__(self, reactor, port, backlog=50, interface=""):
        super().__init__(reactor, port, backlog, interface or "127.0.0.1")


endpoints.TCP4ServerEndpoint = LoopbackTCP4ServerEndpoint

_sqlite_connect = sqlite3.connect


def _connect_unsynced(*args, **kwargs):
    connection = _sqlite_connect(*args, **kwargs)
    connection.execute("PRAGMA synchronous = OFF")
    return connection


sqlite3.connect = _connect_unsynced


def _exit_with_parent():
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        remove = os.environ.get("NEURON_LOCALSTACK_REMOVE_ON_EXIT")
        if remove:
            shutil.rmtree(remove, ignore_errors=True)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    threading.Thread(target=_exit_with_parent, name="exit-with-parent", daemon=True).start()

    from localstack.runtime.main import main

    main()
