"""The chat app's widgets."""
