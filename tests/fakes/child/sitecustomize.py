"""Loaded by a child process whose PYTHONPATH starts with this folder: with FAKE_HUB_UPLOADS=1 its bucket uploads and downloads
go to the fake Hub as plain HTTP (tests/fakes/fake_hub.py explains why Xet cannot be faked)."""

import os
import sys

if os.environ.get("FAKE_HUB_UPLOADS") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
    from huggingface_hub import HfApi

    from fakes.fake_hub import fake_batch_bucket_files, fake_download_bucket_files

    HfApi.batch_bucket_files = fake_batch_bucket_files
    HfApi.download_bucket_files = fake_download_bucket_files
