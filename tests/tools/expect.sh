# Sourced by the tools' shell tests (tests/tools/*_test.sh): a scratch directory $work removed on
# exit, and `expect NAME GOT WANT`, which prints ok or FAIL and sets $fail (the test's exit status).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
expect() {  # expect NAME GOT WANT
  if [[ $2 != "$3" ]]; then echo "FAIL $1: got '$2', want '$3'"; fail=1; else echo "ok   $1"; fi
}
