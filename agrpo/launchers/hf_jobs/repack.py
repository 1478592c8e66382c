"""An agrpo installed without its source (from a wheel, or `pip install git+...`) packed back into a wheel.

When package_root() finds no source tree, the trainer Job must still run the code that launched it: the installed
files listed in the distribution's RECORD (the package, its shipped configs, its dist-info) are zipped into a wheel
with a fresh RECORD, the file pip would have installed from. Byte-compiled files, scripts outside site-packages
and the installer's own records (INSTALLER, REQUESTED, direct_url.json) are left out, as in a built wheel.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path
from typing import Any

INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def installed_distribution() -> Any | None:
    """The installed agrpo distribution that provides the imported package, with its file list; else None."""
    import importlib.metadata

    import agrpo

    try:
        dist = importlib.metadata.distribution("agrpo")
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.files is None or Path(dist.locate_file("agrpo/__init__.py")).resolve() != Path(agrpo.__file__).resolve():
        return None  # another agrpo, or one installed without a RECORD
    return dist


def site_dir(dist: Any) -> str:
    return str(Path(dist.locate_file("")).resolve())


def wheel_name(dist: Any) -> str:
    from packaging.version import Version

    return f"agrpo-{Version(dist.version)}-py3-none-any.whl"


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: Any, out_dir: str) -> Path:
    """Write the wheel of the installed distribution into out_dir and return its path."""
    wheel = Path(out_dir) / wheel_name(dist)
    files = [
        f
        for f in dist.files
        if not str(f).startswith("..")
        and "__pycache__" not in f.parts
        and f.suffix != ".pyc"
        and not (f.parts[0].endswith(".dist-info") and f.name in INSTALLER_FILES)
    ]
    info_dir = next(f.parts[0] for f in dist.files if f.parts[0].endswith(".dist-info"))
    records = []
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for entry in sorted(files, key=lambda f: (f.parts[0] == info_dir, str(f))):  # dist-info last, as wheels do
            data = Path(dist.locate_file(entry)).read_bytes()
            archive.writestr(str(entry), data)
            records.append(f"{entry},{record_hash(data)},{len(data)}")
        records.append(f"{info_dir}/RECORD,,")
        archive.writestr(f"{info_dir}/RECORD", "\n".join(records) + "\n")
    return wheel
