"""Datasets: each loader returns a `datasets.Dataset` with a chat `prompt` column plus the columns rewards read."""

from agrpo.data.loading import load_train_dataset

__all__ = ["load_train_dataset"]
