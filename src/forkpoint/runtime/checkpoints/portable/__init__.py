"""Portable checkpoints: export/import as one archive, push/pull to S3-compatible storage.

``bundle`` (the content-addressed manifest), ``ramdiff`` (RAM as page diffs against the
parent), ``objects`` (the bucket or the archive), ``push`` and ``pull`` (fail-closed),
``common`` (what both share: the home, the digest index, scratch), ``service`` (the four
operations as the runtime offers them).
"""
