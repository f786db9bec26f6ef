"""What the UI, the CLI and the API server share, without Textual: settings and paths, the history store, the
generation controller, tools, model and speculation facts."""
