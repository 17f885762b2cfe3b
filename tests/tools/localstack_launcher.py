"""Starts LocalStack's runtime (as `python -m localstack.runtime.main` does) for the
tests: its gateway on 127.0.0.1 only, and gone with the process that started it.

- LocalStack's twisted gateway takes the port of GATEWAY_LISTEN but ignores its host and
  listens on every interface; the tests may listen on loopback only. Its listeners are
  twisted TCP4ServerEndpoints created without an interface: they get 127.0.0.1.
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
import sys
import threading

from twisted.internet import endpoints

_TCP4ServerEndpoint = endpoints.TCP4ServerEndpoint


class LoopbackTCP4ServerEndpoint(_TCP4ServerEndpoint):
    def __init__(self, reactor, port, backlog=50, interface=""):
        super().__init__(reactor, port, backlog, interface or "127.0.0.1")


endpoints.TCP4ServerEndpoint = LoopbackTCP4ServerEndpoint


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
