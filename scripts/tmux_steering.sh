#!/usr/bin/env bash
# Drive the real app in tmux for issue 22's steering items: make a vector (phases and ETA on stderr), then F6's
# panel while a reply streams, at 80x24 and 120x40. Prints the captured panes. Hermetic: temporary config and data.
# Usage: scripts/tmux_steering.sh [PYTHON]   (run from the repository root; needs tmux and the starter model)
set -euo pipefail
PY=${1:-python}
WORK=$(mktemp -d)
trap 'tmux kill-session -t llmtui-steer 2>/dev/null || true; rm -rf "$WORK"' EXIT
export LLMTUI_CONFIG_DIR=$WORK/config LLMTUI_DATA_DIR=$WORK/data HOME=$WORK/home
mkdir -p "$HOME" "$LLMTUI_DATA_DIR/steering/prompts"
cat > "$LLMTUI_DATA_DIR/steering/prompts/mood.json" <<'JSON'
{"name": "mood", "positive_label": "happy", "negative_label": "sad",
 "pairs": [["I am so happy today", "I am so sad today"], ["What a joy", "What a pity"],
           ["A wonderful day", "An awful day"], ["I love this", "I hate this"]]}
JSON
echo "== steer make (progress on stderr, one line rewritten per step)"
"$PY" -m app steer make --prompts mood 2>&1 | tr '\r' '\n' | grep -v '^$' | awk '!seen[$4 $5]++' | head -12
for size in 80x24 120x40; do
  cols=${size%x*} rows=${size#*x}
  # A running tmux server keeps its own environment: the hermetic dirs go on the command line.
  tmux new-session -d -s llmtui-steer -x "$cols" -y "$rows" \
    "env LLMTUI_CONFIG_DIR='$LLMTUI_CONFIG_DIR' LLMTUI_DATA_DIR='$LLMTUI_DATA_DIR' HOME='$HOME' \
     PYTHONPATH='${PYTHONPATH:-}' $PY -m app"
  sleep 12  # the starter loads
  tmux send-keys -t llmtui-steer "Tell me a long story about a lighthouse keeper." Enter
  sleep 3
  tmux send-keys -t llmtui-steer F6
  sleep 2
  tmux send-keys -t llmtui-steer S-Right S-Right S-Right
  sleep 2
  echo "== $size: F6 while the reply streams, slider moved three coarse steps"
  tmux capture-pane -p -t llmtui-steer
  tmux send-keys -t llmtui-steer Enter  # the strength input opens (a busy machine: give it time)
  sleep 3
  tmux send-keys -t llmtui-steer C-u
  tmux send-keys -t llmtui-steer 1 2
  sleep 1
  tmux send-keys -t llmtui-steer Enter
  sleep 2
  echo "== $size: Enter, 12 typed (past the slider's range)"
  tmux capture-pane -p -t llmtui-steer | tail -14
  tmux send-keys -t llmtui-steer Escape Escape
  sleep 1
  tmux send-keys -t llmtui-steer C-q
  sleep 2
  tmux kill-session -t llmtui-steer 2>/dev/null || true
done
