# Sourced by scripts/mutations.sh and scripts/sim-mutations.sh, from the
# tree's root.
#
# overlay PATCH DIR: applies PATCH to copies of the files it touches under
# DIR/files and writes DIR/overlay.json, which maps each file of the tree
# to its patched copy ("" for a file the patch deletes). `go build` and
# `go test` with -overlay DIR/overlay.json then build the patched tree in
# place of this one without changing it, and share one build cache with
# it: a package no patch touches is compiled once, whatever the patch.
overlay() {
  local p=$1 dir=$2 f sep='' root=$PWD
  mkdir -p "$dir/files"
  while IFS= read -r f; do
    if [ -e "$f" ]; then cp --parents "$f" "$dir/files/"; fi
  done < <(git apply --numstat "$p" | cut -f3-)
  # Outside any repository, git apply patches the files under the working
  # directory as patch(1) would.
  (cd "$dir/files" && git apply "$root/$p") || return 1
  {
    printf '{"Replace":{'
    while IFS= read -r f; do
      if [ -e "$dir/files/$f" ]; then
        printf '%s"%s":"%s"' "$sep" "$root/$f" "$dir/files/$f"
      else
        printf '%s"%s":""' "$sep" "$root/$f"
      fi
      sep=,
    done < <(git apply --numstat "$p" | cut -f3-)
    printf '}}\n'
  } >"$dir/overlay.json"
}
