#!/usr/bin/env bash
# Stage 1 (projector + norm layer). Usage: scripts/pretrain.sh CONFIG [key=value ...]
# e.g. scripts/pretrain.sh configs/llama3.2-3b/ln_textnorm_gwc/stage1.yaml optim.lr=5e-4
set -euo pipefail
config=${1:?usage: scripts/pretrain.sh CONFIG [key=value ...]}; shift
# named from where you call it (a typo too); _launch.sh runs from the repository root (the configs' own paths)
case "$config" in /*) ;; *) config="$PWD/$config" ;; esac
exec "$(dirname "$0")/_launch.sh" train --stage 1 "$config" "$@"  # refused if the config trains the other stage
