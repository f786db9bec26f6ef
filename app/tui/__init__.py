"""The Textual app: the App (`app.py`), its screens, dialogs and widgets, the engine bridges' Textual side, and
every use of Textual's private API. The only package of app/ that imports textual or rich."""
