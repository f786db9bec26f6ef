"""Tools the model may call, with the user's consent: the tool box (built-in tools, MCP servers' tools, definitions
from a file), the call loop every surface shares, and the settings they are read from. No Textual here."""
