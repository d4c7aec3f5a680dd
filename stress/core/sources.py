"""A hash of source files: what decided a kept verdict, so that the verdict is reused only while it is unchanged."""

import glob
import hashlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def fingerprint(folders: tuple[str, ...], files: tuple[str, ...] = ()) -> str:
    """A hash of every ``.py`` file under ``folders`` and of ``files`` (paths from the repository's root), names
    and contents alike."""
    digest = hashlib.sha256()
    paths = [os.path.join(ROOT, f) for f in files] + [p for d in folders for p in glob.glob(
        os.path.join(ROOT, d, "**", "*.py"), recursive=True)]
    for path in sorted(p for p in paths if os.path.exists(p)):
        with open(path, "rb") as f:
            digest.update(os.path.relpath(path, ROOT).encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()[:16]
