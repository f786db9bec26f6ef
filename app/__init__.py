"""llmtui's command line and Textual user interface."""
