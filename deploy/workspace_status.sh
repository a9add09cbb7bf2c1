#!/usr/bin/env bash
# Bazel workspace status for the image's labels (deploy/build_image.sh reads
# them from stable-status.txt). Enable with, in .bazelrc:
#   build --workspace_status_command=deploy/workspace_status.sh
# STABLE_ keys re-run the image action when they change (a new commit).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 0
if git rev-parse HEAD >/dev/null 2>&1; then
  echo "STABLE_GIT_COMMIT $(git rev-parse HEAD)"
  echo "STABLE_GIT_COMMIT_TIME $(git log -1 --format=%ct)"
  echo "STABLE_IMAGE_VERSION $(git describe --tags --always --dirty)"
  remote=$(git config --get remote.origin.url || true)
  [[ -n $remote ]] && echo "STABLE_GIT_REMOTE $remote"
fi
exit 0
