"""SIGTERM handling: finish the step, checkpoint, exit.

Vertex AI (Spot preemption, maintenance) sends SIGTERM. Compute Engine gives a Spot VM 30 s
before the hard stop; Vertex AI does not document the grace inside a training container
(`labkit.hardware.facts`), so the loop acts at once, and checkpoints periodically too. The handler only
sets a flag; the training loop (`labkit.core.loop`, and the TF parameter-server and Keras loops
through its parts) checks it at the end of the step, checkpoints, calls the handler that was
installed before ours (chaining), and raises `labkit.core.train_config.Preempted` (the CLI exits
143). Every training loop of both engines uses this guard.
"""

from __future__ import annotations

import os
import signal
import threading


class PreemptionGuard:
    """Context manager installing the SIGTERM flag handler (main thread only; elsewhere the flag
    can still be set with `trigger()`)."""

    def __init__(self, signum: int = signal.SIGTERM):
        self.signum = signum
        self.requested = False
        self._previous = None
        self._installed = False

    def _handler(self, signum, frame):
        self.requested = True

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signum, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(self.signum, self._previous)
            self._installed = False

    def trigger(self) -> None:
        """The preemption drill: deliver SIGTERM to this process (or just set the flag when the
        handler could not be installed)."""
        if self._installed:
            os.kill(os.getpid(), self.signum)
        else:
            self.requested = True

    def chain(self) -> None:
        """Call the handler that was installed before ours, now that our checkpoint is written."""
        prev = self._previous
        if callable(prev) and prev not in (signal.SIG_DFL, signal.SIG_IGN):
            prev(self.signum, None)
