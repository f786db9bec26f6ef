"""Model catalog, Hugging Face hub access, downloads and the local model library (never imports textual)."""
