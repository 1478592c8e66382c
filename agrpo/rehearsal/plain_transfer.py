"""Bucket file transfer over plain HTTP, in place of Xet, for an HfApi that talks to the stand-in Hub (hub_api.py).

huggingface_hub moves bucket files through Xet's native client, which no local server can stand in for, so an API
object aimed at a stand-in (the rehearsal's RehearsalApi, the tests' fake Hub) replaces exactly two methods with
these: `batch_bucket_files` (uploads: the launcher's wheel, config and inputs) and `download_bucket_files` (`agrpo
pull`). Every other call, and the token on every request, is huggingface_hub's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agrpo.rehearsal.hub_api import FILES_ROUTE


def _headers(api: Any, token: Any) -> dict[str, str]:
    from huggingface_hub import get_token

    value = token if isinstance(token, str) else (api.token or get_token())
    return {"Authorization": f"Bearer {value}"} if value else {}


def plain_batch_bucket_files(self, bucket_id: str, *, add=None, copy=None, delete=None, token=None) -> None:
    """HfApi.batch_bucket_files, adds only: PUT each file's bytes (a path or bytes) to the stand-in."""
    import requests

    if copy or delete:
        raise NotImplementedError("the stand-in Hub only adds files")
    for source, dest in add or []:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        response = requests.put(
            f"{self.endpoint}/{FILES_ROUTE}/{bucket_id}/{dest}", data=data, timeout=60, headers=_headers(self, token)
        )
        response.raise_for_status()


def plain_download_bucket_files(self, bucket_id: str, files, *, raise_on_missing_files=False, token=None) -> None:
    """HfApi.download_bucket_files: GET each (remote path or BucketFile, local path) from the stand-in."""
    import requests

    for remote, local in files:
        path = remote if isinstance(remote, str) else remote.path
        response = requests.get(
            f"{self.endpoint}/{FILES_ROUTE}/{bucket_id}/{path}", timeout=60, headers=_headers(self, token)
        )
        if response.status_code == 404 and not raise_on_missing_files:
            continue
        response.raise_for_status()
        target = Path(local)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(response.content)


def plain_transfer_api(base: type) -> type:
    """`base` (an HfApi class) with plain-HTTP bucket transfers, for talking to a stand-in Hub."""
    return type(
        f"PlainTransfer{base.__name__}",
        (base,),
        {"batch_bucket_files": plain_batch_bucket_files, "download_bucket_files": plain_download_bucket_files},
    )
