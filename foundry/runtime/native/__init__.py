"""The native hook seen from Python: its control API (``hook``) and its region IPC (``ipc``)."""
