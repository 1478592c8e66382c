"""Plugin lookup by config name (launchers, adapter stores)."""

import pytest

from agrpo.errors import ConfigError
from agrpo.launchers import get_launcher
from agrpo.launchers.local import LocalLauncher
from agrpo.plugins import lookup


def test_known_launcher_is_found_by_name():
    assert isinstance(get_launcher("local"), LocalLauncher)


def test_unknown_name_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="launcher.name='nope'"):
        get_launcher("nope")


def test_a_missing_dependency_inside_a_plugin_is_not_hidden(tmp_path, monkeypatch):
    package = tmp_path / "fakeplugins"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        lookup({}, "fakeplugins", "broken", "x.kind")
