"""The chat app's dialogs (one `ModalScreen[T]` each)."""
