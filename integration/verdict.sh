# Sourced by the scenario scripts: runs a scenario's Python script with its
# output shown as it comes and kept, and when it fails prints why as the
# LAST line, so the reason does not scroll away in the test command's
# output:
#
#   NAME: FAIL: <the script's last FAIL line, or its last line> (KEPT in WORK)
#
#   scenario NAME WORK KEPT command...   # the command's exit status
#
# NAME is the prefix the script's own lines carry ("cluster", "suite"), so
# "NAME: FAIL:" is said once. A script's FAIL line names the reason (the
# first difference, the failed scenario); the last non-empty line (a
# traceback's) stands in where none does.
scenario() {
  local name=$1 work=$2 kept=$3 why
  shift 3
  if PYTHONUNBUFFERED=1 "$@" 2>&1 | tee "$work/$name.out"; then
    return 0
  fi
  why=$(grep -a 'FAIL' "$work/$name.out" | tail -n 1 || true)
  [ -n "$why" ] || why=$(grep -a -v '^[[:space:]]*$' "$work/$name.out" | tail -n 1 || true)
  # "NAME: FAIL: x", "NAME[mode]: FAIL, x", "FAIL    combo check x" -> x
  why=$(printf '%s' "$why" | sed -E "s/^$name(\[[^]]*\])?: //; s/^FAIL[:,]?[[:space:]]*//")
  echo "$name: FAIL: ${why:-its script printed nothing} ($kept in $work)" >&2
  return 1
}
