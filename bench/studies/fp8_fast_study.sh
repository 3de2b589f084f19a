#!/usr/bin/env bash
# bench/studies/fp8_fast_study.sh — issue 40: fp8-current's fprop (fast accumulation) under each
# study tile / schedule setting, beside CUTLASS example 57, in one device call. Needs a carried
# study build (-DMOEKIT_SM90_STUDY_OVERRIDE=ON: sm90_fp8_fast_study.cu in the library) with its
# Python module, and the peers of cutlass_fp8_peers.sh. One process per setting (the override is
# read once a process); each prints the kernel that ran (--show-kernels).
#
#   bench/studies/fp8_fast_study.sh BUILD PEERS OUTDIR [SETTING...]
#     SETTING: a MOEKIT_SM90_STUDY value; default: the three fp8_fast tiles
#     e.g. ... fp8_fast=pingpong12 fp8_fast=coop256 "fp8_fast=coop256,raster=n"
set -uo pipefail
build=${1:?usage: fp8_fast_study.sh BUILD PEERS OUTDIR [SETTING...]} peers=${2:?} out=${3:?}
shift 3
(($#)) || set -- fp8_fast=pingpong12 fp8_fast=pingpong21 fp8_fast=coop256
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
rc=0
for setting in "$@"; do
  name=${setting//[=,]/_}
  echo "== MOEKIT_SM90_STUDY=$setting"
  MOEKIT_SM90_STUDY=$setting PYTHONPATH=$build/python-module/python:$here \
    python3 "$here/fp8_gemm_peers.py" --passes fprop --recipes fp8-current --cutlass "$peers" \
      --show-kernels --out "$out/fprop-$name.md" || rc=1
done
exit $rc
