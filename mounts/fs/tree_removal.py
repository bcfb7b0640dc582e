"""Removing store and view trees, whose directories are read-only (0555) by design."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


def remove_tree(path: Path) -> None:
    """rmtree that also works without root: a read-only directory is made writable for its
    owner just before an entry in it is removed. A missing path is not an error."""

    def make_writable_and_retry(function, failed_path, _exc_info) -> None:  # type: ignore[no-untyped-def]
        parent = os.path.dirname(failed_path)
        for directory in (parent, failed_path):
            try:
                st = os.lstat(directory)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(directory, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
            except FileNotFoundError:
                pass
        try:
            function(failed_path)
        except FileNotFoundError:
            pass

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    shutil.rmtree(path, onerror=make_writable_and_retry)
