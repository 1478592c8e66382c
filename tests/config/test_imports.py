"""Import directions: the config layer (schema, validation, the entrypoint) loads no HTTP server, TRL or torch.

Each check runs in a fresh interpreter, since this test session has imported everything already.
"""

import os
import subprocess
import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("aiohttp", "agrpo.proxy.server", "torch", "transformers", "trl")


def loaded_after(code: str) -> list[str]:
    """Which HEAVY modules are in sys.modules after running `code` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_importing_the_config_loads_no_http_server():
    assert loaded_after("import agrpo.config") == []


def test_config_layer_needs_only_the_proxy_settings_module():
    """With the proxy package's __init__ out of the way (what lazy exports give), nothing heavy is left: the config,
    its validation and the CLI module import only agrpo.proxy.settings from the proxy."""
    stub = (
        "import sys, types, agrpo\n"
        "package = types.ModuleType('agrpo.proxy'); package.__path__ = [agrpo.__path__[0] + '/proxy']\n"
        "sys.modules['agrpo.proxy'] = package\n"
        "import agrpo.config, agrpo.config.validate, agrpo.config.environment, agrpo.cli"
    )
    assert loaded_after(stub) == []
