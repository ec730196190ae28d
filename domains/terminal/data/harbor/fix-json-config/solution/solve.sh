#!/bin/bash
set -e
cd /srv/service
sed -i -e 's/,\s*}/}/' -e 's/"port": 8000/"port": 8080/' config.json
sed -i -z 's/,\n}/\n}/' config.json
python3 -m json.tool config.json > /dev/null
