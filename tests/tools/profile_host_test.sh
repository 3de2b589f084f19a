#!/usr/bin/env bash
# ctest tools.profile_host: tools/profile host's table from a stand-in moekit_host_latency
# (HOST_PROFILE_BIN) — inclusive and self shares of the samples and their µs per call, frames
# addr2line cannot name shown by offset — and its exit status when the binary fails or is missing.
# Usage: profile_host_test.sh TOOLS_DIR
set -uo pipefail
tools_dir=$1
tool() { "$tools_dir/profile" host "$@"; }
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
cat >"$work/bin" <<'SH'
#!/usr/bin/env bash
if [[ $# -eq 0 ]]; then echo "host µs per operation (stand-in)"; exit 0; fi
[[ $2 == fail ]] && exit 3
echo "profile: 100 calls, 12.00 us/call enqueue, 10 samples in 1.0 s"
echo "frame 0 /nonexistent/libx.so 0x10 6"
echo "frame 1 /nonexistent/libx.so 0x20 10"
echo "frame 0 /nonexistent/libx.so 0x30 4"
SH
chmod +x "$work/bin"
out=$(HOST_PROFILE_BIN="$work/bin" HOST_PROFILE_TOP=3 tool fprop 2>/dev/null)
expect status "$?" 0
expect first-line "$(sed -n 1p <<<"$out")" "host µs per operation (stand-in)"
expect header "$(grep '^== ' <<<"$out")" "== fprop: profile: 100 calls, 12.00 us/call enqueue, 10 samples in 1.0 s"
expect inclusive "$(grep -A3 -- '-- inclusive' <<<"$out" | tail -3 | tr -s ' ')" \
" 100.0% 12.00 us 0x20 [libx.so]
 60.0% 7.20 us 0x10 [libx.so]
 40.0% 4.80 us 0x30 [libx.so]"
expect self "$(grep -A2 -- '-- self' <<<"$out" | tail -2 | tr -s ' ')" \
" 60.0% 7.20 us 0x10 [libx.so]
 40.0% 4.80 us 0x30 [libx.so]"
HOST_PROFILE_BIN="$work/bin" tool fail >/dev/null 2>&1
expect "failing binary" "$?" 1
HOST_PROFILE_BIN="$work/missing" tool >/dev/null 2>&1
expect "missing binary" "$?" 2
exit $fail
