#!/bin/bash
set -euo pipefail
cd /app
grep -h '^[^ ]* ERROR ' logs/*.log | awk '{sub(/:$/, "", $3); print $3}' | sort | uniq -c \
  | sort -k1,1nr -k2,2 | awk '{print $2, $1}' > "${REPORT_PATH:-/app/report.txt}"
