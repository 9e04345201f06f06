"""SIGTERM (and Ctrl-C) handling: finish the step, checkpoint, exit.

Vertex AI (Spot preemption, maintenance) sends SIGTERM. Compute Engine gives a Spot VM 30 s
before the hard stop; Vertex AI does not document the grace inside a training container
(`labkit.hardware.facts`), so the loop acts at once, and checkpoints periodically too. The handler only
sets a flag; the training loop (`labkit.core.loop`, and the TF parameter-server and Keras loops
through its parts) checks it at the end of the step, checkpoints, calls the handler that was
installed before ours (chaining), and raises `labkit.core.train_config.Preempted` (the CLI exits
143). Every training loop of both engines uses this guard.

Ctrl-C (SIGINT) is treated the same way: the run stops after the step with a checkpoint, instead
of a KeyboardInterrupt that loses the steps since the last one. A second Ctrl-C, for someone
who will not wait for the checkpoint, raises KeyboardInterrupt at once.
"""

from __future__ import annotations

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionGuard:
    """Context manager installing the stop flag handlers for SIGTERM and SIGINT (main thread
    only; elsewhere the flag can still be set with `trigger()`). `signum`: the signal that set
    the flag (the drill's is SIGTERM)."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS):
        self.signals = tuple(signals)
        self.requested = False
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._installed = False

    def _handler(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: do not wait for the checkpoint
        self.requested = True
        self.signum = self.signum or signum

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handler) for sig in self.signals}
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._installed = False

    def trigger(self) -> None:
        """The preemption drill: deliver SIGTERM to this process (or just set the flag when the
        handler could not be installed)."""
        if self._installed and signal.SIGTERM in self.signals:
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            self.requested = True
            self.signum = self.signum or signal.SIGTERM

    def chain(self) -> None:
        """Call the handler that was installed before ours for the signal that arrived, now that
        our checkpoint is written. Python's own SIGINT handler is not called: it would turn the
        handled Ctrl-C into a KeyboardInterrupt."""
        prev = self._previous.get(self.signum or signal.SIGTERM)
        if callable(prev) and prev not in (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler):
            prev(self.signum, None)

    @property
    def reason(self) -> str:
        """What stopped the run, for messages: "SIGTERM" or "Ctrl-C (SIGINT)"."""
        return "Ctrl-C (SIGINT)" if self.signum == signal.SIGINT else "SIGTERM"
