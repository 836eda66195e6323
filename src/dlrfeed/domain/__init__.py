"""Pure domain code: receipts, parsing, the status state machine. Imports no I/O library."""
