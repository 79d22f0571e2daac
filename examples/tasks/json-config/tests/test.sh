#!/bin/bash
# Verifier for json-config: writes /logs/verifier/reward.json ({"reward": 1.0 or 0.0, ...}).
mkdir -p /logs/verifier
python3 - <<'PY'
import json

expected = {
    "name": "inventory",
    "debug": False,
    "server": {"host": "127.0.0.1", "port": 8080, "workers": 2},
    "features": ["search", "export", "metrics"],
    "owners": ["ops@example.com"],
}
try:
    config = json.load(open("/app/config.json"))
except (OSError, ValueError) as exc:
    print(f"FAIL: /app/config.json is unreadable: {exc}")
    config = None
keys_ok = isinstance(config, dict) and set(config) == set(expected)
passed = config == expected
print("PASS" if passed else f"FAIL: got {config!r}")
rewards = {"reward": float(passed), "keys_ok": float(keys_ok)}
with open("/logs/verifier/reward.json", "w") as out:
    json.dump(rewards, out)
PY
