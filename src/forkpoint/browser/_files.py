"""Writing output files so a reader never sees a half-written PNG."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

from PIL import Image

__all__ = ["save_png", "write_atomically"]


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + rename; creates missing parent dirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are plain output files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_png(image: Image.Image, path: Path) -> None:
    """Save ``image`` as PNG at ``path``, atomically."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    write_atomically(path, buffer.getvalue())
