"""``pharos_api.stack.settings_env``: the settings a parent hands to its children (pharos up's
services, ``pharos run`` started by tests and the demo) come back the same in the child: unset
fields stay unset (not the text "None", which once made `pharos run` look for a token file
named None and skip the job's hint), secrets keep their value, lists survive."""

from __future__ import annotations

import os
import subprocess
import sys

from pydantic import SecretStr

from pharos_api.stack import settings_env
from pharos_core.settings import Settings


def test_settings_round_trip_through_the_environment(tmp_path):
    s = Settings(state_dir=tmp_path, api_token=SecretStr("pht_x_secret"), fwd_target_limits_mb_s=[50.0, 80.0])
    env = settings_env(s)
    assert "PHAROS_API_TOKEN_FILE" not in env and "PHAROS_IMPORT_DIR" not in env
    assert env["PHAROS_API_TOKEN"] == "pht_x_secret"
    code = (
        "from pharos_core.settings import Settings; s = Settings(); "
        "print(s.api_token_file, s.import_dir, s.api_token.get_secret_value(), s.fwd_target_limits_mb_s, s.state_dir)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PHAROS_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["None", "None", "pht_x_secret", "[50.0,", "80.0]", str(tmp_path)], out.stdout
