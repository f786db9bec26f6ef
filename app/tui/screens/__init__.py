"""The chat app's screens."""
