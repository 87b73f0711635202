#!/usr/bin/env bash
# Build every catalog operator end to end (all seven stages) into out/catalog/<name>, then print a summary.
# Usage: bash scripts/catalog.sh [name ...]   (default: every request under examples/)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for d in examples/*/; do [ -f "$d/request.yaml" ] && names+=("$(basename "$d")"); done
fi
mkdir -p out/catalog
summary=out/catalog/summary.tsv
printf 'op\tstatus\tseconds\tprecision\n' > "$summary"
for n in "${names[@]}"; do
  start=$(date +%s)
  .venv/bin/opforge op run "examples/$n" --out "out/catalog/$n" --force --json > "out/catalog/$n.json" 2> "out/catalog/$n.log"
  secs=$(( $(date +%s) - start ))
  status=$(.venv/bin/python -c "import json,sys; print((json.load(open(sys.argv[1])).get('terminal') or {}).get('status','?'))" "out/catalog/$n.json" 2>/dev/null || echo "?")
  prec=$(head -3 "out/catalog/$n/PRECISION.md" 2>/dev/null | grep -o 'Cases: [0-9/]* passed' || echo "-")
  printf '%s\t%s\t%s\t%s\n' "$n" "$status" "$secs" "$prec" | tee -a "$summary"
done
column -t -s $'\t' "$summary"
! grep -qv -e 'SUCCESS' -e '^op' "$summary"
