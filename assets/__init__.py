"""Static data shipped with llmtui (styles, prompt sets); installed as the `llmtui_assets` package."""
