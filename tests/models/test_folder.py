"""Built model folders are reused only when complete and built from the same spec."""

from agrpo.models.folder import folder_matches, save_model_folder


class Saver:
    def __init__(self, name):
        self.name = name

    def save_pretrained(self, path):
        (path / f"{self.name}.txt").write_text(self.name)


def test_saved_folder_matches_its_spec_only(tmp_path):
    target = tmp_path / "model"
    save_model_folder(Saver("weights"), Saver("tokenizer"), target, "marker.json", {"layers": 2})
    assert sorted(p.name for p in target.iterdir()) == ["marker.json", "tokenizer.txt", "weights.txt"]
    assert folder_matches(target, "marker.json", {"layers": 2})
    assert not folder_matches(target, "marker.json", {"layers": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging folder left behind


def test_folder_without_marker_is_an_interrupted_build(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.txt").write_text("half")
    assert not folder_matches(tmp_path / "model", "marker.json", {"layers": 2})
    save_model_folder(Saver("weights"), Saver("tokenizer"), tmp_path / "model", "marker.json", {"layers": 2})
    assert (tmp_path / "model" / "weights.txt").read_text() == "weights"
