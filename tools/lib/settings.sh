# shellcheck shell=bash
# Sourced by the subcommands that take environment settings as one comma-separated list
# (tools/compare env and orders, tools/profile gemm).
# split_settings LIST: LIST's VAR=VALUE entries into the array `settings`, split at the commas;
# an entry that does not begin with an environment variable's name in capitals (VAR=) continues
# the one before it, so MOEKIT_SM90_STUDY=order=blocked,swizzle=2 (the sm90 study override, whose
# keys are lower case) stays one setting: "MOEKIT_SM90_STUDY=order=blocked,swizzle=2,MOEKIT_SIDE_STREAM=0"
# is two.
split_settings() {
  local parts p
  settings=()
  IFS=, read -ra parts <<<"$1"
  for p in "${parts[@]}"; do
    if (( ${#settings[@]} )) && [[ ! $p =~ ^[A-Z_][A-Z0-9_]*= ]]; then
      settings[-1]+=",$p"
    else
      settings+=("$p")
    fi
  done
}
