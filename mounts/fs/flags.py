"""The open(2) flag sets of every host-side file access, declared once.

Below a directory a sandbox can write, every name may be a planted symlink or FIFO:
- `O_NOFOLLOW` refuses a symlink as the last component (the walk in `nofollow.py` opens one
  component at a time, so every component is the last one once);
- `O_NONBLOCK` on reads: open(2) of a FIFO for reading waits for a writer, which a sandbox
  never sends; with it the open returns at once and the type check on the descriptor refuses;
- `O_EXCL` on creation: a name that exists (a planted link included) is an error, not a target;
- `O_CLOEXEC` everywhere: no descriptor leaks into an agent or a docker CLI we start.
"""

from __future__ import annotations

import os

# A directory below a root, never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The same without read permission (a directory a sandbox locked at mode 0), to chmod it back.
PATH_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A root the operator configured (it may be reached through a symlink of theirs).
ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# A file to read: refused if a symlink, and never waiting on a FIFO.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A new file under a fresh name: never an existing entry, never through a symlink.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# A lock file: created when missing, never through a symlink.
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
