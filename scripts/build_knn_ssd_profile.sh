#!/bin/bash
# Rebuild the KNN-SSD profile shipped for the embedded SmolLM2
# (nest_integrations/data/knn_ssd/SmolLM2-135M-Instruct/default.json) with the real CLI:
# domain prompts, anchors, then round-robin resumable skip-set searches (one trial budget per
# round, every domain and the Mix set), fp32, one torch thread; stops entering new rounds after
# $BUDGET seconds (default 840), then copies the profile into the package without local paths.
#   NEST_BUILD_HOME=/tmp/knnssd-home BUDGET=840 scripts/build_knn_ssd_profile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HOME_DIR=${NEST_BUILD_HOME:-/tmp/knnssd-home}
mkdir -p "$HOME_DIR"
[ -e "$HOME_DIR/models" ] || [ -z "${NEST_HOME:-}" ] || ln -s "$NEST_HOME/models" "$HOME_DIR/models"
export NEST_HOME=$HOME_DIR NEST_THREADS=1 HF_HUB_OFFLINE=1
N="python -m nest_integrations.cli"
P=$HOME_DIR/prompts
START=$(date +%s)
$N knn-ssd prompts --out "$P"
DOMAINS="python-code python-docs wiki-en wiki-fr"
for d in $DOMAINS; do
  $N knn-ssd anchors --domain $d --prompts "$P/$d.train.jsonl" --dtype fp32 --threads 1
done
ALL=""; for d in $DOMAINS; do ALL="$ALL --prompts $P/$d.train.jsonl"; done
for T in ${ROUNDS:-8 16 24 32 40 48 64}; do
  for d in $DOMAINS mixed; do
    if [ "$T" != "${ROUNDS%% *}" ] && [ $(( $(date +%s) - START )) -gt ${BUDGET:-840} ]; then
      break 2
    fi
    if [ $d = mixed ]; then args=$ALL; else args="--prompts $P/$d.train.jsonl"; fi
    $N knn-ssd search --domain $d $args --trials $T --dtype fp32 --threads 1
  done
done
python - "$HOME_DIR" <<'PY'
import json, sys
from pathlib import Path
src = next(Path(sys.argv[1], "knn_ssd").glob("*/default.json"))
data = json.loads(src.read_text())
for d in data["domains"].values():
    d["search"].pop("storage", None)  # a local SQLite path
name = data["model"].split("@")[0]
out = Path("nest_integrations/data/knn_ssd") / name / "default.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(data, indent=1) + "\n")
print(f"{src} -> {out}")
PY
