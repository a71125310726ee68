"""Portable checkpoints: export/import as one archive, push/pull to S3-compatible storage.

``bundle`` (the content-addressed manifest), ``ramdiff`` (RAM as page diffs against the
parent), ``objects`` (the bucket or the archive), ``transfer`` (push and fail-closed pull).
"""
