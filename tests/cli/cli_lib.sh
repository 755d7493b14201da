# Shared by the end-to-end scripts of tests/cli (run_set.sh, run_grid.sh), sourced after they set WORK: a failure
# prints the message and the tail of every log the script wrote, then exits 1.
fail() {
  echo "FAIL: $*"
  for f in "$WORK"/*.log; do
    [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }
  done
  exit 1
}
expect_in() {  # expect_in FILE REGEX
  grep -Eq -- "$2" "$1" || fail "$1 does not match /$2/"
}
# A field of the last record of a metrics.jsonl, as written.
field() {  # field FILE NAME
  tail -n 1 "$1" | grep -o "\"$2\":[^,}]*" | cut -d: -f2
}
