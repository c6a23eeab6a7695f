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
  echo "| tool | family | exit | driver | errors (sanitizer summary) | seconds |"
  echo "|---|---|---|---|---|---|"
} > "$SUMMARY"
status=0
# memcheck runs every family in one process; racecheck and initcheck one process per family
# (SANITIZE_FAMILIES overrides), so an abort inside one family leaves the others' verdicts.
FAMILIES=${SANITIZE_FAMILIES:-kbit_formats kbit_gemv kbit_mma kbit_dequant awq kbit_grouped awq_grouped kbit_moe_experts}
for tool in $TOOLS; do
  extra=()
  [ "$tool" = racecheck ] && extra+=(--racecheck-report all)
  [ -n "$SANITIZE_FILTER" ] && extra+=(--kernel-name "$SANITIZE_FILTER")
  if [ "$tool" = memcheck ]; then groups=("all"); else read -r -a groups <<< "$FAMILIES"; fi
  for fam in "${groups[@]}"; do
    args=(); [ "$fam" != all ] && args=("$fam")
    log="$OUT/sanitize_${tool}_${fam}.log"
    start=$(date +%s)
    timeout 200 "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 50 "${extra[@]}" \
        python3 scripts/sanitize_driver.py "${args[@]}" > "$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    errs=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 | sed 's/^========= //')
    drv=$(grep -E "^driver done" "$log" | tail -1)
    echo "| $tool | $fam | $rc | ${drv:-did not finish} | ${errs:-none printed} | $secs |" >> "$SUMMARY"
    # the most frequent distinct error kinds and kernels, for the record
    { echo; echo "### $tool / $fam: most frequent reports"; echo; echo '```'
      grep -E "^========= +(Invalid|Uninitialized|Error|Race|Warning|Program hit|Internal|in |at |Write|Read)" "$log" \
        | sort | uniq -c | sort -rn | head -15
      echo '```'; } >> "$OUT/details.md"
    [ $rc -ne 0 ] && status=1
  done
done
[ -f "$OUT/details.md" ] && cat "$OUT/details.md" >> "$SUMMARY" && rm "$OUT/details.md"
cat "$SUMMARY"
exit $status
