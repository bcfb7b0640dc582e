"""Per-user disk and inode quotas (docs/disk-quotas.md): loop-mounted ext4 images where the
orchestrator is root, a bounded periodic usage scan where it is not, and the host watermark."""
