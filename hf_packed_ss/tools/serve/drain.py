"""SIGTERM drains the server: what an orchestrator (Kubernetes, systemd) sends before it stops a replica.

On the first SIGTERM the gate answers every new request 503 with `Retry-After` (`/health` turns "draining", 503,
so a balancer stops sending), while the requests already in (decoding, or queued) are finished. When none is left,
or `drain_s` is nearly spent, uvicorn is asked to exit; at that bound the rows still decoding end after their round
with what they have (`finish_reason` "timeout") and queued ones are answered 503 (`Batcher.cut`). The process then
exits 0. A second SIGTERM exits at once; SIGINT is uvicorn's (the batch in flight finishes)."""

from __future__ import annotations

import logging
import signal
import threading
import time

import uvicorn

from .batcher import Batcher
from .gate import ServerState

log = logging.getLogger("hf_packed_ss.serve")


class DrainingServer(uvicorn.Server):
    """uvicorn's server with SIGTERM turned into a bounded drain."""

    def __init__(self, config: uvicorn.Config, state: ServerState, batcher: Batcher, drain_s: float):
        super().__init__(config)
        self.state, self.batcher, self.drain_s = state, batcher, drain_s

    def handle_exit(self, sig: int, frame) -> None:
        if sig != signal.SIGTERM:
            return super().handle_exit(sig, frame)
        if self.state.draining:  # a second SIGTERM: now
            self.should_exit = True
            return
        # (not re-raised after the serve, as uvicorn does with the signals it captures: the exit code is ours)
        self.state.draining, self.state.drain_until = True, time.monotonic() + self.drain_s
        threading.Thread(target=self.drain, name="hf-packed-ss-drain", daemon=True).start()

    def drain(self) -> None:
        """Wait for the requests in flight; at the bound, cut what is left; then tell uvicorn to exit."""
        begin = time.monotonic()
        # keep back a part of the bound for the answers to go out and for uvicorn and Python to shut down
        cut_at = begin + max(0.0, self.drain_s - min(2.0, self.drain_s / 4))
        print(f"hf-packed-ss serve: draining ({self.state.in_flight} requests in flight, at most "
              f"{self.drain_s:g} s)", flush=True)
        while self.busy() and time.monotonic() < cut_at:
            time.sleep(0.02)
        if self.busy():
            log.warning("drain bound reached: %d rows cut, %d waiting requests refused", self.batcher.active_rows,
                        self.batcher.queued)
            self.batcher.cut()
            end = time.monotonic() + min(1.0, self.drain_s / 8)
            while self.state.in_flight and time.monotonic() < end:  # the cut answers go out
                time.sleep(0.02)
        print(f"hf-packed-ss serve: drained in {time.monotonic() - begin:.1f} s", flush=True)
        # a connection still open now (a client that reads no more) is closed once what is left of the bound is up
        self.config.timeout_graceful_shutdown = max(0.5, self.state.drain_until - time.monotonic() - 0.5)
        self.should_exit = True

    def busy(self) -> bool:
        return bool(self.state.in_flight or self.batcher.active_rows or self.batcher.queued)
