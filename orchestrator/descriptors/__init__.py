"""The process's file descriptors: its limit, and the budget that keeps it from running out."""
