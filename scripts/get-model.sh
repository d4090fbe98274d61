#!/usr/bin/env bash
# Prints the path of stories260K.gguf, the default model: from the fixtures
# folder when present ($KESTREL_FIXTURES or ../shared/fixtures), otherwise
# downloaded once into models/ from its public Hugging Face location and
# checked against its sha256.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sha=270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d
url=https://huggingface.co/ggml-org/tiny-llamas/resolve/main/stories260K.gguf
for dir in "${KESTREL_FIXTURES:-}" "$root/../shared/fixtures"; do
  if [ -n "$dir" ] && [ -f "$dir/gguf/stories260K.gguf" ]; then echo "$dir/gguf/stories260K.gguf"; exit 0; fi
done
out="$root/models/stories260K.gguf"
if [ ! -f "$out" ]; then
  mkdir -p "$root/models"
  echo "kestrel: downloading $url" >&2
  curl -fL --retry 3 -o "$out.part" "$url"
  mv "$out.part" "$out"
fi
echo "$sha  $out" | sha256sum -c --quiet - >&2 || { echo "kestrel: $out does not match sha256 $sha" >&2; rm -f "$out"; exit 1; }
echo "$out"
