"""`llmtui serve` and the app's server toggle: the loaded model as a local OpenAI-compatible HTTP API.

- `requests`: a request body (bytes from a client we do not trust) → a bounded, validated `Job`, or an `ApiError`.
- `responses`: OpenAI's response and stream-chunk shapes, usage and llama-server's `timings`.
- `metrics`: counters, rendered as Prometheus text at `GET /metrics`.
- `backend`: runs jobs on the engine (a bounded queue, one request's steering and speculation at a time).
- `asgi`: the Starlette app: routes, the API key, body limits, CORS, streaming, disconnects.
- `access` and `gate`: who may call it (Host names, browser origins, JSON bodies, the API key's characters), checked
  before any route.
- `listen`: uvicorn with time limits for headers and bodies, bounded connections and a one-line log.

Never imports textual: the CLI serves without the UI; the app runs the same server beside its chat.
"""
