"""Keep numba's on-disk cache honest about the scalar math the kernels inline.

numba's cache checks only the timestamp of the file that defines a cached
function, but qtool's kernels inline the scalar math of ``_scalar.py`` (built
by ``_targets.py``, and for some modules through ``cpu.py``). A digest of
those files is kept beside the cache; when it changes, the module's cached
kernels are dropped before numba looks at them.
"""

from __future__ import annotations

import hashlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def drop_stale_cache(module: str, sources: tuple[str, ...]) -> None:
    """Remove ``__pycache__/<module>.*.nbi|nbc`` when any of ``sources`` changed."""
    digest = hashlib.sha256()
    try:
        for name in sources:
            with open(os.path.join(_HERE, name), "rb") as f:
                digest.update(f.read())
    except OSError:
        return
    cache = os.path.join(_HERE, "__pycache__")
    marker = os.path.join(cache, f"qtool-{module}-scalar.sha256")
    try:
        with open(marker) as f:
            if f.read() == digest.hexdigest():
                return
    except OSError:
        pass
    try:
        os.makedirs(cache, exist_ok=True)
        for entry in os.listdir(cache):
            if entry.startswith(f"{module}.") and entry.endswith((".nbi", ".nbc")):
                os.remove(os.path.join(cache, entry))
        with open(marker, "w") as f:
            f.write(digest.hexdigest())
    except OSError:  # a read-only install: numba then caches elsewhere, keyed by the module's file
        pass
