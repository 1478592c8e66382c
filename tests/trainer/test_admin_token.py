"""The trainer's side of the proxy's admin token: TRL's VLLMClient sends it on every call once the launcher gave it."""

import json
from agrpo.trainer.seam.module_patches import _BearerRequests
from tests.http_stand_in import post_stand_in


def test_every_call_carries_the_bearer_and_keeps_its_own_arguments():
    seen = []
    with post_stand_in(lambda path, headers, raw: seen.append((path, headers.get("Authorization"), raw))) as url:
        stand_in = _BearerRequests("s3cret")
        stand_in.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "trl-policy-v1"}, timeout=5)
        stand_in.post(f"{url}/pause", params={"mode": "keep"}, headers={"X-Other": "1"}, timeout=5)
    (path1, auth1, body1), (path2, auth2, _) = seen
    assert (path1, auth1, json.loads(body1)) == (
        "/v1/load_lora_adapter",
        "Bearer s3cret",
        {"lora_name": "trl-policy-v1"},
    )
    assert (path2, auth2) == ("/pause?mode=keep", "Bearer s3cret")
    import requests

    assert stand_in.ConnectionError is requests.ConnectionError  # TRL's except clauses still match
