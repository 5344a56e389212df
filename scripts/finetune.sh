#!/usr/bin/env bash
# Stage 2 (full fine-tune). Usage: scripts/finetune.sh CONFIG [key=value ...]
set -euo pipefail
config=${1:?usage: scripts/finetune.sh CONFIG [key=value ...]}; shift
# named from where you call it (a typo too); _launch.sh runs from the repository root (the configs' own paths)
case "$config" in /*) ;; *) config="$PWD/$config" ;; esac
exec "$(dirname "$0")/_launch.sh" train --stage 2 "$config" "$@"  # refused if the config trains the other stage
