"""The host's stdlib-only file toolkit for directories a sandbox can write (docs/security.md,
"The host's file toolkit"): the open flag sets (`flags`), no-follow opens and reads on directory
fds (`nofollow`), write-to-temp-then-rename (`atomic_write`), tree removal (`tree_removal`),
locks (`lock`) and the rename-swap (`rename_swap`)."""
