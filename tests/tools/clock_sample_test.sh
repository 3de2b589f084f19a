#!/usr/bin/env bash
# ctest tools.clock_sample: tools/lib/clock-sample (the GPU tools' clock/power/throttle sampling) on
# fixed samples and with a stand-in nvidia-smi, so its parsing and exit status are checked on
# machines without a GPU too. Usage: clock_sample_test.sh TOOLS_DIR
set -uo pipefail
tool="$1/lib/clock-sample"
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"

# Busy samples are those at >= half the run's peak power (600 W here: the 100 W idle one drops).
cat >"$work/run.smi" <<'S'
1410, 590.0, 0x0000000000000004
1425, 600.0, 0x0000000000000004
1440, 580.0, 0x0000000000000000
345, 100.0, 0x0000000000000001
not a sample line
S
expect summary "$("$tool" summary "$work/run.smi")" \
  "SM 1425 MHz, 590 W (median of 3 busy samples); clock limited by: sw power cap 66%"
expect mhz "$("$tool" summary "$work/run.smi" --mhz)" "1425"
# Drivers without the clock-event field: clock and power only.
printf '1500, 500.0\n1520, 510.0\n' >"$work/old.smi"
expect no-reasons "$("$tool" summary "$work/old.smi")" "SM 1510 MHz, 505 W (median of 2 busy samples)"
expect empty "$("$tool" summary "$work/missing.smi")" ""

# `run`: the command's exit status comes back and the sampler is stopped (a stand-in nvidia-smi).
mkdir "$work/bin"
cat >"$work/bin/nvidia-smi" <<'S'
#!/usr/bin/env bash
if [[ " $* " == *" -lms "* ]]; then
  while true; do echo "1500, 600.0, 0x0000000000000008"; sleep 0.02; done
fi
echo "1500, 600.0, 0x0000000000000008"
S
chmod +x "$work/bin/nvidia-smi"
PATH="$work/bin:$PATH" "$tool" run "$work/cmd.smi" bash -c 'sleep 0.3; exit 3'
expect exit-status "$?" "3"
expect sampled "$("$tool" summary "$work/cmd.smi" | sed 's/(median of [0-9]* busy samples)/(...)/')" \
  "SM 1500 MHz, 600 W (...); clock limited by: hw slowdown 100%"
sleep 0.1
expect sampler-stopped "$(pgrep -f "$work/bin/nvidia-smi" | wc -l)" "0"
exit $fail
