"""The test HTTP servers' base: a client hanging up mid-answer (what the hostile-input tests make llmtui do, and what
a cancelled download does) is expected, not a traceback on the run's output."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):  # reset, broken pipe, aborted, timed out
            return
        super().handle_error(request, client_address)
