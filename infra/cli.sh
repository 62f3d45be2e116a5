# Sourced by the infra scripts, before they install or start anything: `--help`/`-h` prints the script's usage
# (its $USAGE) and exits 0; for a script that takes no arguments (`no_arguments "$@"`), anything else is refused
# with the usage and exit status 2, as argparse refuses for the Python entry points (core/cli.py).
wants_help() {
  local arg
  for arg in "$@"; do
    if [ "$arg" = --help ] || [ "$arg" = -h ]; then printf '%s\n' "$USAGE"; exit 0; fi
  done
}
no_arguments() {
  wants_help "$@"
  if [ $# -gt 0 ]; then
    printf '%s\n%s: error: unrecognized arguments: %s\n' "$USAGE" "$0" "$*" >&2
    exit 2
  fi
}
