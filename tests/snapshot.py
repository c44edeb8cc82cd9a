"""What a bad input must not change (every entry under a path with its type, size, mtime and
bytes), and the damage the bad-input tests do to files."""
import hashlib
import os


def snapshot(path):
    """Every entry under `path` with its type, size, mtime and content hash (None if absent)."""
    if not os.path.exists(path):
        return None
    out = {}
    entries = [os.path.join(root, name) for root, dirs, files in os.walk(path) for name in dirs + files]
    for p in [str(path)] + entries:
        st = os.stat(p)
        digest = None
        if os.path.isfile(p):
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        out[os.path.relpath(p, path)] = (os.path.isdir(p), st.st_size, st.st_mtime_ns, digest)
    return out


def truncate_files(folder):
    """Cut every file under `folder` to a third of its size (a damaged checkpoint or export)."""
    for root, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "r+b") as f:
                f.truncate(os.path.getsize(p) // 3)
