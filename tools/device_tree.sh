#!/usr/bin/env bash
# A device call copies the tracked and the untracked-not-ignored files of this tree plus what it carries, 64 MiB
# in all; the repository's tracked files alone are ~58 MB, so a call that carries packed GPU programs
# (tools/pack_devbin.sh) leaves out of the copy the fixtures it does not read:
#   tools/device_tree.sh slim [PATH ...]   # untrack PATHs (default: the tokenizer vocabularies, the fuzz
#                                          # corpora, the chat templates, the JSONSchemaBench sample, docs/,
#                                          # bench/, python/) in the index and ignore them in .git/info/exclude
#   tools/device_tree.sh size              # MB the call would copy, without carry
#   tools/device_tree.sh restore           # the index and .git/info/exclude as before
# The files stay on disk. Do not commit while slimmed (the index has them removed): commit or stash first,
# restore after the call.
set -euo pipefail
cd "$(dirname "$0")/.."
begin='# device_tree.sh slim: begin' end='# device_tree.sh slim: end'
case "${1:-}" in
  slim)
    shift
    paths=("$@")
    [ ${#paths[@]} -gt 0 ] || paths=(tests/fixtures/vocab tests/fixtures/fuzz tests/fixtures/templates
                                     tests/fixtures/jsonschemabench docs bench python)
    if ! git diff --cached --quiet; then
      echo "device_tree: the index has staged changes; commit or unstage them first" >&2
      exit 1
    fi
    echo "$begin" >> .git/info/exclude
    for p in "${paths[@]}"; do
      git rm -r -q --cached -- "$p"
      echo "/$p/" >> .git/info/exclude
    done
    echo "$end" >> .git/info/exclude
    ;;
  restore)
    git reset -q
    sed -i "/^$begin\$/,/^$end\$/d" .git/info/exclude
    ;;
  size) ;;
  *)
    sed -n '2,11p' "$0"
    exit 2
    ;;
esac
git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 |
  awk '{printf "the call copies %.1f MB of this tree (64 MiB = 67.1 MB with what it carries)\n", $1 / 1e6}'
