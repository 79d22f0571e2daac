#!/bin/bash
# One command per line: a scripted agent replays these as its actions.
python3 -c 'import json; c = json.load(open("/app/config.json")); c["debug"] = False; c["server"]["port"] = 8080; c["features"].append("metrics"); json.dump(c, open("/app/config.json", "w"), indent=2)'
python3 -m json.tool /app/config.json
