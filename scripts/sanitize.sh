#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and initcheck over scripts/sanitize_driver.py, which calls
# every kernel family once on small shapes (issue #9). On the GPU machine, from the repo root, with
# the library built or carried in kbit_vllm/lib:
#   PYTHONPATH=. bash scripts/sanitize.sh            # logs + sanitize_summary.md under $OUT
# SANITIZE_TOOLS="memcheck" limits the tools; SANITIZE_FILTER=kns=<substring> limits instrumented
# kernels (default: all, so torch's own kernels are checked too and named in the report).
set -o pipefail
OUT=${OUT:-sanitize_out}
mkdir -p "$OUT"; rm -f "$OUT/details.md"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
export KBIT_VLLM_STRICT=1   # never let a missing kernel pass as the PyTorch path
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck initcheck}
SUMMARY="$OUT/sanitize_summary.md"
{
  echo "# compute-sanitizer $(date -u +%Y-%m-%d) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
  "$SAN" --version 2>/dev/null | tail -1 | sed 's/^/sanitizer: /'
  python3 -c "from kbit_vllm.backends.cuda import library; print('library:', library.STATUS)"
  echo
  echo "| tool | exit | driver | errors (sanitizer summary) | seconds |"
  echo "|---|---|---|---|---|"
} > "$SUMMARY"
status=0
for tool in $TOOLS; do
  extra=()
  [ "$tool" = racecheck ] && extra+=(--racecheck-report hazard)
  [ "$tool" = initcheck ] && extra+=(--track-unused-memory no)
  [ -n "$SANITIZE_FILTER" ] && extra+=(--kernel-name "$SANITIZE_FILTER")
  start=$(date +%s)
  timeout 200 "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 50 "${extra[@]}" \
      python3 scripts/sanitize_driver.py > "$OUT/sanitize_$tool.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  errs=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.log" | tail -1 | sed 's/^========= //')
  drv=$(grep -E "^driver done" "$OUT/sanitize_$tool.log" | tail -1)
  echo "| $tool | $rc | ${drv:-did not finish} | ${errs:-none printed} | $secs |" >> "$SUMMARY"
  # the most frequent distinct error kinds and kernels, for the record
  { echo; echo "### $tool: most frequent reports"; echo; echo '```'
    grep -E "^========= +(Invalid|Uninitialized|Error|Race|Warning|Program hit|in |at )" "$OUT/sanitize_$tool.log" \
      | sort | uniq -c | sort -rn | head -15
    echo '```'; } >> "$OUT/details.md"
  [ $rc -ne 0 ] && status=1
done
[ -f "$OUT/details.md" ] && cat "$OUT/details.md" >> "$SUMMARY" && rm "$OUT/details.md"
cat "$SUMMARY"
exit $status
